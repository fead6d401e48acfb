// A job's Python environment (used by job.js; not a route): the packages it asked for
// (config.requirements merged with its model package's requirements.txt), and the environment
// a worker resolved them to: its hash, its state and the packages it adds to the worker's own.
// Text goes in as text nodes only.

import { el, table } from "../util.js";

// What a starting job is doing before its processes run ("preparing_environment" ->
// "preparing environment"); "" when nothing.
export function phaseText(job) {
  return job.phase ? job.phase.replaceAll("_", " ") : "";
}

// {node, show(job)}: the section, and how to redraw it from a job as the stream brings it.
export function environmentPanel() {
  const node = el("div", { id: "job-environment" });
  let shown = "";

  function show(job) {
    const key = JSON.stringify([job.requirements, job.environment]);
    if (key === shown) return; // (showJob runs every second: keep the DOM as it is)
    shown = key;
    if (!job.requirements?.length) {
      node.replaceChildren(el("p", { class: "muted" }, "No packages beyond the worker's own."));
      return;
    }
    const parts = [
      el("p", {}, "Requirements: ", el("code", { id: "job-requirements" }, job.requirements.join(", "))),
    ];
    const environment = job.environment;
    if (!environment) {
      parts.push(el("p", { class: "muted" }, "Not resolved yet: a worker resolves them when the job starts."));
    } else {
      parts.push(
        el(
          "p",
          {},
          "Environment ",
          el("code", { id: "job-environment-hash", title: environment.hash }, environment.hash.slice(0, 16)),
          " ",
          el("span", { class: `state state-${environment.state || "unknown"}` }, environment.state || "gone"),
        ),
        table(
          [
            { label: "Package", value: (row) => row.name },
            { label: "Version", value: (row) => row.version },
          ],
          environment.packages,
          { empty: "No packages yet (still building).", rowAttrs: (row) => ({ "data-package": row.name }) },
        ),
      );
    }
    node.replaceChildren(...parts);
  }

  return { node, show };
}
