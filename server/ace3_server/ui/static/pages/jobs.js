// The jobs list: newest first, filtered by state and by name (the API's `state` and `q`),
// paged with the API's cursors, refreshed every few seconds; tick jobs to compare them.

import { durationBetween, el, errorBox, formatDuration, formatNumber, formatTime, link, stateBadge, table } from "../util.js";

const PAGE_SIZE = 20;
const REFRESH_MS = 5000;
export const STATES = ["queued", "starting", "running", "cancelling", "succeeded", "failed", "cancelled"];
export const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);

// "epoch 2/5 · step 120/300" and how far along (0..1): the job's newest metric (`progress`)
// against the engine's plan (`plan.total_steps`, known once the run started), else the config.
export function progressOf(job) {
  const epochs = job.plan?.epochs || job.config?.epochs;
  const maxSteps = job.plan?.total_steps || job.config?.max_steps;
  const progress = job.progress;
  if (job.state === "succeeded") return { fraction: 1, text: progress ? `step ${progress.step}` : "done" };
  if (!progress) return { fraction: TERMINAL.has(job.state) ? null : 0, text: TERMINAL.has(job.state) ? "" : "not started" };
  const parts = [];
  if (progress.epoch !== null && epochs) parts.push(`epoch ${progress.epoch}/${epochs}`);
  parts.push(maxSteps ? `step ${progress.step}/${maxSteps}` : `step ${progress.step}`);
  let fraction = null;
  if (maxSteps) fraction = progress.step / maxSteps;
  else if (progress.epoch !== null && epochs) fraction = (progress.epoch - 1) / epochs;
  return { fraction: fraction === null ? null : Math.min(1, Math.max(0, fraction)), text: parts.join(" · ") };
}

function progressCell(job) {
  const { fraction, text } = progressOf(job);
  return el(
    "div",
    { class: "progress" },
    fraction === null ? null : el("div", { class: "progress-bar" }, el("div", { style: `width: ${Math.round(fraction * 100)}%` })),
    el("span", { class: "muted" }, text),
  );
}

// The job's best figure from its final metrics (finished jobs only).
export function bestMetric(job) {
  const metrics = job.final_metrics || {};
  for (const [name, label] of [
    ["best_val_accuracy", "best val_accuracy"],
    ["val_accuracy", "val_accuracy"],
    ["val_loss", "val_loss"],
    ["train_loss", "train_loss"],
  ]) {
    if (typeof metrics[name] === "number") return `${label} ${formatNumber(metrics[name])}`;
  }
  return "";
}

export function jobLabel(job) {
  return job.name || job.id;
}

export async function render(root, { api, query, navigate }) {
  const pageSize = Math.min(200, Math.max(1, Number(query.get("limit")) || PAGE_SIZE));
  const selected = new Set();
  const cursors = [null]; // cursors[i] opens page i
  let pageIndex = 0;
  let nextCursor = null;
  let timer = null;
  let loading = 0;

  const stateSelect = el(
    "select",
    { id: "jobs-state", "aria-label": "State" },
    el("option", { value: "" }, "All states"),
    STATES.map((state) => el("option", { value: state }, state)),
  );
  const search = el("input", { id: "jobs-search", type: "search", placeholder: "Name contains…", "aria-label": "Name contains" });
  stateSelect.value = STATES.includes(query.get("state")) ? query.get("state") : "";
  search.value = query.get("q") || "";
  const compare = el("button", { id: "jobs-compare", type: "button", class: "primary", disabled: true }, "Compare");
  const previous = el("button", { id: "jobs-previous", type: "button", disabled: true }, "← Newer");
  const next = el("button", { id: "jobs-next", type: "button", disabled: true }, "Older →");
  const pageLabel = el("span", { class: "muted" });
  const body = el("div", { id: "jobs-table" });

  root.append(
    el("div", { class: "page-head" }, el("h1", {}, "Jobs"), el("span", { class: "spacer" }), compare),
    el("div", { class: "toolbar" }, stateSelect, search),
    body,
    el("div", { class: "toolbar pager" }, previous, pageLabel, next),
  );

  function updateCompare() {
    compare.disabled = selected.size < 1;
    compare.textContent = selected.size ? `Compare (${selected.size})` : "Compare";
  }

  async function load() {
    const mine = ++loading;
    let page;
    try {
      page = await api.get("/jobs", {
        limit: pageSize,
        cursor: cursors[pageIndex],
        state: stateSelect.value,
        q: search.value.trim(),
      });
    } catch (error) {
      if (mine === loading) body.replaceChildren(errorBox(error));
      return;
    }
    if (mine !== loading) return;
    nextCursor = page.next_cursor;
    previous.disabled = pageIndex === 0;
    next.disabled = !nextCursor;
    pageLabel.textContent = `Page ${pageIndex + 1}`;
    const columns = [
      {
        label: "",
        className: "select",
        value: (job) => {
          const box = el("input", { type: "checkbox", "aria-label": `Select ${jobLabel(job)}`, checked: selected.has(job.id) });
          box.addEventListener("change", () => {
            if (box.checked) selected.add(job.id);
            else selected.delete(job.id);
            updateCompare();
          });
          return box;
        },
      },
      { label: "Name", value: (job) => link(`#/jobs/${encodeURIComponent(job.id)}`, jobLabel(job)) },
      { label: "State", value: (job) => stateBadge(job.state) },
      { label: "Progress", value: progressCell },
      { label: "Duration", value: (job) => formatDuration(durationBetween(job.started_at, job.finished_at)) },
      { label: "Best metric", value: bestMetric },
      { label: "Created", value: (job) => formatTime(job.created_at) },
    ];
    const empty = stateSelect.value || search.value.trim() ? "No job matches these filters." : "No jobs yet: submit one with the SDK or `ace3 train job.yaml`.";
    body.replaceChildren(table(columns, page.data, { empty, rowAttrs: (job) => ({ "data-job-id": job.id, "data-state": job.state }) }));
  }

  function restart() {
    cursors.length = 1;
    pageIndex = 0;
    // The filters live in the route (kept when coming back from a job), without a re-render.
    const route = new URLSearchParams();
    if (stateSelect.value) route.set("state", stateSelect.value);
    if (search.value.trim()) route.set("q", search.value.trim());
    if (query.get("limit")) route.set("limit", query.get("limit"));
    history.replaceState(null, "", `#/jobs${route.toString() ? `?${route}` : ""}`);
    load();
  }

  let typing = null;
  search.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(restart, 250);
  });
  stateSelect.addEventListener("change", restart);
  previous.addEventListener("click", () => {
    if (pageIndex > 0) pageIndex -= 1;
    load();
  });
  next.addEventListener("click", () => {
    if (!nextCursor) return;
    cursors[pageIndex + 1] = nextCursor;
    pageIndex += 1;
    load();
  });
  compare.addEventListener("click", () => navigate(`#/compare?ids=${[...selected].map(encodeURIComponent).join(",")}`));

  await load();
  // The first page is refreshed (new jobs appear), others while a listed job can change.
  timer = setInterval(() => {
    const states = [...body.querySelectorAll("tr[data-state]")].map((row) => row.dataset.state);
    if (pageIndex === 0 || states.some((state) => !TERMINAL.has(state))) load();
  }, REFRESH_MS);
  return () => {
    clearInterval(timer);
    clearTimeout(typing);
    loading += 1;
  };
}
