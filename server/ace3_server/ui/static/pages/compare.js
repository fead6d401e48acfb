// Several jobs' curves overlaid: one chart per metric, one series per job (#/compare?ids=a,b).
// Jobs are added from the recent ones or removed; the ids live in the route.

import { chartControls, LineChart } from "../charts.js";
import { el, errorBox, stateBadge } from "../util.js";
import { CHARTS } from "./job.js";
import { jobLabel, TERMINAL } from "./jobs.js";

export async function render(root, { api, query, navigate }) {
  const ids = [...new Set((query.get("ids") || "").split(",").map((id) => id.trim()).filter(Boolean))];
  const go = (next) => navigate(next.length ? `#/compare?ids=${next.map(encodeURIComponent).join(",")}` : "#/compare");

  const recent = await api.get("/jobs", { limit: 50 });
  const picker = el(
    "select",
    { id: "compare-add", "aria-label": "Add a job" },
    el("option", { value: "" }, "Add a job…"),
    recent.data.filter((job) => !ids.includes(job.id)).map((job) => el("option", { value: job.id }, `${jobLabel(job)} (${job.state})`)),
  );
  picker.addEventListener("change", () => {
    if (picker.value) go([...ids, picker.value]);
  });

  const results = await Promise.all(
    ids.map(async (id) => {
      const path = `/jobs/${encodeURIComponent(id)}`;
      try {
        const [job, metrics] = await Promise.all([api.get(path), api.get(`${path}/metrics`)]);
        return { id, job, metrics: metrics.data };
      } catch (error) {
        return { id, error };
      }
    }),
  );

  // Series names: the job's name, with its id when two jobs share one.
  const counts = new Map();
  for (const { job } of results) if (job) counts.set(jobLabel(job), (counts.get(jobLabel(job)) || 0) + 1);
  const seriesName = (job) => (counts.get(jobLabel(job)) > 1 ? `${jobLabel(job)} (${job.id.slice(0, 8)})` : jobLabel(job));

  const chips = el(
    "div",
    { class: "chips", id: "compare-jobs" },
    results.map(({ id, job, error }) =>
      el(
        "span",
        { class: "chip", "data-job-id": id },
        job
          ? [el("a", { href: `#/jobs/${encodeURIComponent(id)}` }, seriesName(job)), " ", stateBadge(job.state)]
          : el("span", { class: "error" }, `${id}: ${error.status === 404 ? "not found" : error.message}`),
        " ",
        el("button", { type: "button", class: "chip-remove", "aria-label": `Remove ${id}`, onclick: () => go(ids.filter((other) => other !== id)) }, "×"),
      ),
    ),
  );
  root.append(el("h1", {}, "Compare jobs"), el("div", { class: "toolbar" }, chips, picker));

  if (!results.some(({ job }) => job)) {
    root.append(el("p", { class: "empty" }, "Pick jobs to compare: tick them in the jobs list, or add them here."));
    return null;
  }

  const charts = [];
  const grid = el("div", { class: "charts" });
  for (const { metric, title } of CHARTS) {
    const container = el("div", { id: `chart-${metric}`, "data-metric": metric });
    grid.append(container);
    const chart = new LineChart(container, { title });
    for (const { job, metrics } of results) {
      if (!job) continue;
      chart.setSeries(
        seriesName(job),
        metrics.filter((point) => point.name === metric).map((point) => [point.step, point.value]),
      );
    }
    charts.push(chart);
  }
  root.append(chartControls(() => charts), grid);
  if (results.some(({ error }) => error)) root.append(errorBox(new Error("Some jobs could not be loaded (see above).")));

  // Jobs still training: their new points every few seconds (since the newest step held).
  const chartOf = new Map(CHARTS.map(({ metric }, index) => [metric, charts[index]]));
  const live = results.filter(({ job }) => job && !TERMINAL.has(job.state));
  for (const entry of live) entry.lastStep = Math.max(0, ...entry.metrics.map((point) => point.step));
  let busy = false;
  const timer = setInterval(async () => {
    if (busy || !live.length) return;
    busy = true;
    try {
      for (const entry of [...live]) {
        const path = `/jobs/${encodeURIComponent(entry.id)}`;
        const [job, metrics] = await Promise.all([api.get(path), api.get(`${path}/metrics`, { since_step: entry.lastStep })]);
        for (const point of metrics.data) {
          chartOf.get(point.name)?.add(seriesName(entry.job), point.step, point.value);
          entry.lastStep = Math.max(entry.lastStep, point.step);
        }
        const badge = chips.querySelector(`.chip[data-job-id="${CSS.escape(entry.id)}"] .state`);
        if (badge) badge.replaceWith(stateBadge(job.state));
        if (TERMINAL.has(job.state)) live.splice(live.indexOf(entry), 1);
      }
    } catch {
      /* the next tick tries again */
    } finally {
      busy = false;
    }
  }, 5000);
  return () => {
    clearInterval(timer);
    charts.forEach((chart) => chart.destroy());
  };
}
