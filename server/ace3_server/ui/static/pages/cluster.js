// Cluster: the live workers and what they can run, and the queue — the owner's queued jobs in
// the order workers take them, with each one's place in the whole queue (other owners' jobs
// are only counted). Refreshes every 5 s while the page is open.

import { clear, durationBetween, el, errorBox, formatDuration, formatTime, link, table } from "../util.js";

const REFRESH_MS = 5000;
const WAITS_FOR = { quota: "your quota", priority: "jobs ahead", capacity: "a free worker" };

function card(label, value, id) {
  return el("div", { class: "card", id }, el("div", { class: "label" }, label), el("div", { class: "value" }, value));
}

function ago(iso) {
  const seconds = durationBetween(iso, null);
  return seconds === null ? "" : `${formatDuration(seconds)} ago`;
}

export async function render(root, { api }) {
  const cards = el("div", { class: "cards" });
  const workersBox = el("div", { id: "workers" });
  const queueBox = el("div", { id: "queue" });
  const status = el("p", { class: "error", role: "alert" });
  root.append(
    el("h1", {}, "Cluster"),
    status,
    cards,
    el("h2", {}, "Workers"),
    workersBox,
    el("h2", {}, "Your queued jobs"),
    el("p", { class: "muted" }, "In the order workers take them: by priority, then owners take turns. Position 1 is next; other owners' jobs count towards positions but are not shown."),
    queueBox,
  );

  let stopped = false;
  let timer = null;

  async function refresh() {
    clearTimeout(timer);
    let workers;
    let queue;
    try {
      [{ data: workers }, queue] = await Promise.all([api.get("/workers"), api.get("/queue")]);
    } catch (error) {
      if (stopped) return;
      status.textContent = "";
      status.append(errorBox(error));
      timer = setTimeout(refresh, REFRESH_MS * 2);
      return;
    }
    if (stopped) return;
    status.textContent = "";
    const slots = workers.reduce((total, worker) => total + worker.slots, 0);
    const largest = workers.reduce((most, worker) => Math.max(most, worker.device_count), 0);
    clear(cards);
    cards.append(
      card("Live workers", String(workers.length), "card-workers"),
      card("Job slots", String(slots), "card-slots"),
      card("Running jobs (all owners)", String(queue.running), "card-running"),
      card("Free slots", String(Math.max(0, slots - queue.running)), "card-free"),
      card("Queued jobs (all owners)", String(queue.queued), "card-queued"),
      card("Largest job", largest ? `${largest} processes` : "—"),
    );
    clear(workersBox);
    workersBox.append(
      table(
        [
          { label: "Host", value: (w) => w.hostname },
          { label: "Devices", value: (w) => `${w.device_count} × ${w.device_kind === "cuda" ? "GPU" : "CPU process"}` },
          { label: "Slots", value: (w) => String(w.slots), className: "num" },
          { label: "Queue", value: (w) => w.queue },
          { label: "Started", value: (w) => formatTime(w.started_at) },
          { label: "Last seen", value: (w) => ago(w.last_seen_at) },
        ],
        workers,
        { empty: "No live worker: queued jobs wait until one starts (ace3 worker).", rowAttrs: (w) => ({ "data-worker": w.id }) },
      ),
    );
    clear(queueBox);
    queueBox.append(
      table(
        [
          { label: "Position", value: (j) => el("strong", {}, `#${j.position}`), className: "num" },
          { label: "Job", value: (j) => link(`#/jobs/${encodeURIComponent(j.id)}`, j.name || j.id) },
          { label: "Priority", value: (j) => j.priority },
          { label: "Waits for", value: (j) => WAITS_FOR[j.waiting_reason] || j.waiting_reason || "" },
          { label: "Processes", value: (j) => String(j.num_processes), className: "num" },
          { label: "Waiting", value: (j) => formatDuration(durationBetween(j.queued_at, null)) },
          { label: "Created", value: (j) => formatTime(j.created_at) },
        ],
        queue.data,
        { empty: "None of your jobs is waiting.", rowAttrs: (j) => ({ "data-queued-job": j.id }) },
      ),
    );
    timer = setTimeout(refresh, REFRESH_MS);
  }

  await refresh();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
