// One search: its state and Cancel, the trials table (params, state incl. pruned, objective,
// each trial's job), the best-so-far curve and one plot per searched parameter against the
// objective. Polls every 2 s while the search runs; the poll stops when the user leaves.

import { PALETTE, TRIAL_COLORS, TrialChart, bestSoFar, isNumber, paramAxis } from "../trialcharts.js";
import { clear, durationBetween, el, errorBox, formatDuration, formatNumber, formatTime, link, stateBadge, table } from "../util.js";
import { trialCounts } from "./searches.js";

const POLL_MS = 2000;
const FINISHED = new Set(["succeeded", "failed", "cancelled"]);

function formatParam(value) {
  if (isNumber(value)) return formatNumber(value);
  return typeof value === "string" ? value : JSON.stringify(value);
}

function bestValue(search) {
  const best = search.best_trial;
  if (!best || !isNumber(best.value)) return el("span", { class: "muted" }, "—");
  return el("span", {}, formatNumber(best.value), " ", el("span", { class: "muted" }, `trial ${best.number}`));
}

function card(label, value) {
  return el("div", { class: "card" }, el("div", { class: "label" }, label), el("div", { class: "value" }, value));
}

export async function render(root, { api, params }) {
  const id = params.id;
  const path = `/searches/${encodeURIComponent(id)}`;
  const title = el("h1", {}, "Search");
  const cancel = el("button", { type: "button", class: "danger", id: "cancel-search", hidden: true }, "Cancel search");
  const status = el("p", { class: "error", role: "alert" });
  const cards = el("div", { class: "cards" });
  const bestChart = el("div", { id: "best-so-far" });
  const curvesChart = el("div", { id: "trial-curves" });
  const paramCharts = el("div", { class: "charts", id: "param-charts" });
  const trialsBox = el("div", { id: "trials" });
  root.append(
    el("div", { class: "toolbar" }, link("#/searches", "← Searches")),
    el("div", { class: "page-head" }, title, el("span", { class: "spacer" }), cancel),
    status,
    cards,
    el("h2", {}, "Best so far"),
    el("div", { class: "charts" }, bestChart, curvesChart),
    el("h2", {}, "Parameters against the objective"),
    paramCharts,
    el("h2", {}, "Trials"),
    trialsBox,
  );

  let stopped = false;
  let timer = null;
  let best = null;
  let curves = null;
  const perParam = new Map(); // parameter -> {chart, axis}

  cancel.addEventListener("click", async () => {
    if (!window.confirm("Cancel this search? Running trials are stopped; its best trial so far is kept.")) return;
    cancel.disabled = true;
    try {
      await api.post(`${path}/cancel`);
      status.textContent = "";
    } catch (error) {
      status.textContent = `Could not cancel: ${error.message}`;
      cancel.disabled = false;
    }
    poll();
  });

  function drawHeader(search) {
    title.textContent = "";
    title.append(search.name || search.id, " ", stateBadge(search.state));
    const done = FINISHED.has(search.state);
    cancel.hidden = done;
    cancel.disabled = done || search.cancel_requested;
    clear(cards);
    const config = search.config || {};
    cards.append(
      card("Trials", trialCounts(search)),
      card(`Best ${config.objective || "objective"} (${config.direction || ""})`, bestValue(search)),
      card("Algorithm", `${config.algorithm || ""}${config.pruner && config.pruner !== "none" ? ` · pruner ${config.pruner}` : ""}`),
      card("Epochs trained", String(search.epochs_run ?? "")),
      card("Created", formatTime(search.created_at)),
      card("Duration", formatDuration(durationBetween(search.created_at, search.finished_at))),
    );
    if (search.error) cards.append(card("Error", el("span", { class: "error" }, search.error)));
  }

  function drawTrials(search, trials) {
    const names = Object.keys(search.config?.search_space || {});
    const bestId = search.best_trial?.id;
    clear(trialsBox);
    trialsBox.append(
      table(
        [
          { label: "#", value: (t) => String(t.number) },
          { label: "State", value: (t) => stateBadge(t.state) },
          ...names.map((name) => ({ label: name, value: (t) => formatParam(t.params?.[name]), className: "num" })),
          { label: search.config?.objective || "objective", value: (t) => formatNumber(t.value), className: "num" },
          { label: "Epochs", value: (t) => String(t.epochs_run ?? ""), className: "num" },
          {
            label: "Duration",
            value: (t) => formatDuration(durationBetween(t.created_at, t.finished_at)),
          },
          { label: "Job", value: (t) => (t.job_id ? link(`#/jobs/${encodeURIComponent(t.job_id)}`, t.job_id) : "") },
          trials.some((t) => t.error) && { label: "Note", value: (t) => (t.error ? el("span", { class: "muted" }, t.error) : "") },
        ].filter(Boolean),
        [...trials].sort((a, b) => a.number - b.number),
        {
          empty: "No trials yet.",
          rowAttrs: (t) => ({ "data-trial": String(t.number), class: t.id === bestId ? "best-trial" : undefined }),
        },
      ),
    );
  }

  function drawCharts(search, trials) {
    const config = search.config || {};
    const objective = config.objective || "objective";
    const points = bestSoFar(trials, config.direction);
    if (!best) best = new TrialChart(bestChart, {
        title: `Best ${objective} so far`,
        xLabel: "trial",
        yLabel: objective,
        integerX: true,
        empty: "No trial has finished yet.",
      });
    best.set(
      points.map((p) => p.number),
      [
        { label: "best so far", color: TRIAL_COLORS.best, line: "stepped", points: false, values: points.map((p) => p.best) },
        {
          label: "succeeded",
          color: TRIAL_COLORS.succeeded,
          points: true,
          values: points.map((p) => (p.state === "succeeded" ? p.value : null)),
        },
        {
          label: "pruned",
          color: TRIAL_COLORS.pruned,
          points: true,
          values: points.map((p) => (p.state === "pruned" ? p.value : null)),
        },
      ],
    );
    // Each trial's objective after every epoch (what the pruner judged), joined on the epoch.
    if (!curves) {
      curves = new TrialChart(curvesChart, {
        title: `${objective} by epoch, per trial`,
        xLabel: "epoch",
        yLabel: objective,
        integerX: true,
        empty: "No trial has reported an epoch yet.",
      });
    }
    const reported = [...trials]
      .sort((a, b) => a.number - b.number)
      .map((trial) => ({
        trial,
        values: new Map(
          Object.entries(trial.intermediate_values || {})
            .map(([epoch, value]) => [Number(epoch), value])
            .filter(([epoch, value]) => Number.isFinite(epoch) && isNumber(value)),
        ),
      }))
      .filter(({ values }) => values.size);
    const epochs = [...new Set(reported.flatMap(({ values }) => [...values.keys()]))].sort((a, b) => a - b);
    curves.set(
      epochs,
      reported.map(({ trial, values }) => ({
        label: `trial ${trial.number}`,
        color: PALETTE[trial.number % PALETTE.length],
        line: "linear",
        points: true,
        values: epochs.map((epoch) => values.get(epoch) ?? null),
      })),
    );
    const space = config.search_space || {};
    for (const [name, dimension] of Object.entries(space)) {
      const scored = trials.filter((t) => isNumber(t.value) && (t.state === "succeeded" || t.state === "pruned") && name in (t.params || {}));
      let entry = perParam.get(name);
      if (!entry) {
        const axis = paramAxis(dimension, trials.map((t) => t.params?.[name]));
        const container = el("div", { class: "param-chart", "data-param": name });
        paramCharts.append(container);
        entry = {
          axis,
          chart: new TrialChart(container, {
            title: `${objective} by ${name}`,
            xLabel: name,
            yLabel: objective,
            xLog: axis.log,
            categories: axis.categories,
            xRange: axis.range,
            empty: "No trial has reported an objective yet.",
          }),
        };
        perParam.set(name, entry);
      }
      const rows = scored
        .map((t) => ({ x: entry.axis.x(t.params[name]), value: t.value, state: t.state }))
        .filter((row) => isNumber(row.x) && row.x >= 0)
        .sort((a, b) => a.x - b.x);
      entry.chart.set(
        rows.map((row) => row.x),
        [
          { label: "succeeded", color: TRIAL_COLORS.succeeded, points: true, values: rows.map((r) => (r.state === "succeeded" ? r.value : null)) },
          { label: "pruned", color: TRIAL_COLORS.pruned, points: true, values: rows.map((r) => (r.state === "pruned" ? r.value : null)) },
        ],
      );
    }
  }

  async function poll() {
    clearTimeout(timer);
    let search;
    let trials;
    try {
      [search, { data: trials }] = await Promise.all([api.get(path), api.get(`${path}/trials`)]);
    } catch (error) {
      if (stopped) return;
      if (error.status === 404) {
        clear(root);
        root.append(el("h1", {}, "Search not found"), el("p", {}, link("#/searches", "Back to the searches")));
        return;
      }
      status.textContent = `Could not refresh: ${error.message}`;
      timer = setTimeout(poll, POLL_MS * 2);
      return;
    }
    if (stopped) return;
    drawHeader(search);
    drawTrials(search, trials);
    drawCharts(search, trials);
    root.dataset.state = search.state;
    if (!FINISHED.has(search.state)) timer = setTimeout(poll, POLL_MS);
  }

  try {
    await poll();
  } catch (error) {
    root.append(errorBox(error));
  }
  return () => {
    stopped = true;
    clearTimeout(timer);
    best?.destroy();
    curves?.destroy();
    for (const { chart } of perParam.values()) chart.destroy();
  };
}
