// A job's live log panel (used by job.js; not a route): the newest lines, a rank filter
// (all / service / rank N / stderr) and auto-scroll. Lines go in as text nodes only.

import { el } from "../util.js";

const MAX_LOG_LINES = 5000;

export function rankLabel(log) {
  if (log.stream === "service") return "service";
  return log.rank === null || log.rank === undefined ? log.stream : `rank ${log.rank}`;
}

// {node, add(log)}: the panel, and how to append a line as the stream brings it.
export function logPanel() {
  const logs = el("pre", { class: "logs", id: "job-logs" });
  const rankFilter = el("select", { id: "log-rank", "aria-label": "Rank" }, el("option", { value: "" }, "All ranks"));
  const follow = el("input", { type: "checkbox", checked: true, "aria-label": "Auto-scroll" });
  const ranksSeen = new Set();
  const lines = [];

  const visible = (log) => !rankFilter.value || rankFilter.value === rankLabel(log);
  function lineNode(log) {
    const label = rankLabel(log);
    return el("span", { class: `log-line log-${log.stream}`, "data-rank": label }, `[${label}] ${log.line}\n`);
  }

  function add(log) {
    const label = rankLabel(log);
    if (!ranksSeen.has(label)) {
      ranksSeen.add(label);
      const options = [...ranksSeen].sort((a, b) => a.localeCompare(b, undefined, { numeric: true }));
      const chosen = rankFilter.value;
      rankFilter.replaceChildren(
        el("option", { value: "" }, "All ranks"),
        ...options.map((name) => el("option", { value: name }, name)),
      );
      rankFilter.value = chosen;
    }
    lines.push(log);
    if (lines.length > MAX_LOG_LINES && visible(lines.shift())) logs.firstChild?.remove();
    if (visible(log)) logs.append(lineNode(log));
    if (follow.checked) logs.scrollTop = logs.scrollHeight;
  }

  rankFilter.addEventListener("change", () => {
    logs.replaceChildren(...lines.filter(visible).map(lineNode));
    logs.scrollTop = logs.scrollHeight;
  });

  const node = el("div", {}, el("div", { class: "toolbar" }, rankFilter, el("label", {}, follow, " Auto-scroll")), logs);
  return { node, add };
}
