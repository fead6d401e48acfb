// Searches: the owner's hyperparameter searches, newest first, a page at a time (the API's
// cursors), with a state filter. Refreshes while a search on the page is still going.

import { clear, cursorPager, el, errorBox, formatNumber, formatTime, link, stateBadge, table } from "../util.js";

const PAGE_SIZE = 25;
const STATES = ["", "queued", "running", "cancelling", "succeeded", "failed", "cancelled"];
const FINISHED = new Set(["succeeded", "failed", "cancelled"]);
const REFRESH_MS = 5000;

export function trialCounts(search) {
  const parts = [
    el("strong", {}, `${search.trials_created}/${search.trial_budget}`),
    search.trials_running ? ` · ${search.trials_running} running` : "",
    search.trials_succeeded ? ` · ${search.trials_succeeded} succeeded` : "",
    search.trials_pruned ? ` · ${search.trials_pruned} pruned` : "",
    search.trials_failed ? ` · ${search.trials_failed} failed` : "",
  ];
  return el("span", { class: "trial-counts" }, parts);
}

export function bestObjective(search) {
  const best = search.best_trial;
  if (!best || best.value === null || best.value === undefined) return el("span", { class: "muted" }, "—");
  const objective = search.config?.objective || "objective";
  return el("span", {}, formatNumber(best.value), " ", el("span", { class: "muted" }, `${objective} (trial ${best.number})`));
}

export async function render(root, { api, query, navigate }) {
  const state = query.get("state") || "";
  const filter = el("select", { "aria-label": "State", id: "searches-state" }, STATES.map((name) => el("option", { value: name }, name || "all states")));
  filter.value = state;
  filter.addEventListener("change", () => navigate(filter.value ? `#/searches?state=${filter.value}` : "#/searches"));
  const body = el("div", { id: "searches-body" });
  const pager = el("div", { class: "pager" });
  root.append(el("h1", {}, "Searches"), el("div", { class: "toolbar" }, filter), body, pager);

  const cursors = [null]; // the cursor of each page seen so far; the last one is shown
  let timer = null;
  let stopped = false;

  async function show() {
    clearTimeout(timer);
    let page;
    try {
      page = await api.get("/searches", { limit: PAGE_SIZE, state, cursor: cursors[cursors.length - 1] });
    } catch (error) {
      clear(body);
      body.append(errorBox(error));
      return;
    }
    if (stopped) return;
    clear(body);
    body.append(
      table(
        [
          { label: "Name", value: (s) => link(`#/searches/${encodeURIComponent(s.id)}`, s.name || s.id) },
          { label: "State", value: (s) => stateBadge(s.state) },
          { label: "Trials", value: trialCounts },
          { label: "Best", value: bestObjective },
          { label: "Direction", value: (s) => s.config?.direction || "" },
          { label: "Created", value: (s) => formatTime(s.created_at) },
        ],
        page.data,
        {
          empty: state ? `No ${state} searches.` : "No searches yet: start one with ace3.hyperparameter_search().",
          rowAttrs: (s) => ({ "data-search-id": s.id }),
        },
      ),
    );
    cursorPager(pager, cursors, page, show);
    if (page.data.some((s) => !FINISHED.has(s.state))) timer = setTimeout(show, REFRESH_MS);
  }

  await show();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
