// The search page's charts over the vendored uPlot: points (and optionally a stepped line) of
// trials, x by trial number or by a parameter's value. Like LineChart, the container's
// data-points attribute counts the points drawn (the browser tests read it).

import { formatNumber } from "./util.js";

export const TRIAL_COLORS = { succeeded: "#16a34a", pruned: "#9ca3af", best: "#2563eb" };

export const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];

// series: [{label, color, line: false | "stepped" | "linear", points: bool, values}]
export class TrialChart {
  constructor(
    container,
    { title = "", xLabel = "", yLabel = "", xLog = false, categories = null, xRange = null, integerX = false, empty = "No points yet.", height = 220 } = {},
  ) {
    this.container = container;
    this.title = title;
    this.xLabel = xLabel;
    this.yLabel = yLabel;
    this.xLog = xLog;
    this.categories = categories; // x = index into these labels
    this.integerX = integerX;
    this.xRange = xRange; // [low, high] of a searched dimension: the axis shows the whole space
    this.height = height;
    this.plot = null;
    this.shape = "";
    this.container.classList.add("chart");
    this.container.dataset.points = "0";
    this.container.dataset.empty = empty;
    this.container.classList.add("is-empty");
    this.resize = new ResizeObserver(() => this.plot?.setSize(this.size()));
    this.resize.observe(this.container);
  }

  size() {
    return { width: Math.max(this.container.clientWidth - 10, 200), height: this.height };
  }

  // xs ascending; each series' values align with xs (null where it has no point).
  set(xs, series) {
    const drawn = series.reduce(
      (total, one) => total + (one.points ? one.values.filter((v) => v !== null && v !== undefined).length : 0),
      0,
    );
    this.container.dataset.points = String(drawn);
    this.container.classList.toggle("is-empty", drawn === 0);
    const data = [xs, ...series.map((one) => one.values)];
    const shape = series.map((one) => one.label).join("\u0000");
    if (this.plot && shape === this.shape) {
      this.plot.setData(data);
      return;
    }
    this.plot?.destroy();
    this.shape = shape;
    const categories = this.categories;
    const xAxis = { label: this.xLabel };
    if (this.integerX) xAxis.incrs = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000];
    if (!categories) xAxis.values = (_, splits) => splits.map((v) => (v === null ? "" : formatNumber(v)));
    if (categories) {
      xAxis.splits = () => categories.map((_, index) => index);
      xAxis.values = (_, splits) => splits.map((index) => categories[index] ?? "");
    }
    const xScale = { time: false };
    if (this.xLog) xScale.distr = 3;
    if (categories) xScale.range = () => [-0.5, categories.length - 0.5];
    else if (this.xRange) xScale.range = () => this.xRange;
    this.plot = new window.uPlot(
      {
        title: this.title,
        ...this.size(),
        scales: { x: xScale, y: {} },
        axes: [xAxis, { label: this.yLabel, values: (_, splits) => splits.map((v) => formatNumber(v)) }],
        series: [
          { label: this.xLabel, value: (_, v) => (categories ? (categories[v] ?? "") : formatNumber(v)) },
          ...series.map((one) => ({
            label: one.label,
            stroke: one.color,
            fill: undefined,
            width: one.line ? 2 : 0,
            spanGaps: true,
            paths: !one.line ? () => null : one.line === "stepped" ? window.uPlot.paths.stepped({ align: 1 }) : undefined,
            points: one.points ? { show: true, size: one.line ? 5 : 8, fill: one.color, stroke: one.color } : { show: false },
            value: (_, v) => formatNumber(v),
          })),
        ],
        legend: { live: true },
      },
      data,
      this.container,
    );
  }

  destroy() {
    this.resize.disconnect();
    this.plot?.destroy();
    this.plot = null;
  }
}

// The objective of the best trial so far, by trial number: [{number, value, best}] for the
// trials that reported an objective, in number order. Only succeeded trials compete for best
// (as the service decides the search's best trial).
export function bestSoFar(trials, direction) {
  const better = direction === "minimize" ? (a, b) => a < b : (a, b) => a > b;
  let best = null;
  return [...trials]
    .sort((a, b) => a.number - b.number)
    .map((trial) => {
      if (trial.state === "succeeded" && isNumber(trial.value) && (best === null || better(trial.value, best))) {
        best = trial.value;
      }
      return { number: trial.number, value: isNumber(trial.value) ? trial.value : null, state: trial.state, best };
    });
}

export function isNumber(value) {
  return typeof value === "number" && Number.isFinite(value);
}

// How a searched parameter's values sit on an x axis: numbers as they are (log for log-scaled
// dimensions), anything else as categories in the dimension's order.
export function paramAxis(dimension, values) {
  const type = dimension?.type;
  const options = Array.isArray(dimension?.options) ? dimension.options : null;
  // A choice is a set of categories, even of numbers: its options sit evenly on the axis.
  const numeric = !options && values.every((v) => v === null || v === undefined || isNumber(v));
  const log = type === "loguniform" || type === "qloguniform";
  const [low, high] = [dimension?.low, dimension?.high];
  let range = null; // the searched interval, a little wider so points on its ends show whole
  if (isNumber(low) && isNumber(high) && high > low && (!log || low > 0)) {
    range = log ? [low / 1.15, high * 1.15] : [low - (high - low) * 0.04, high + (high - low) * 0.04];
  }
  if (numeric) return { log, categories: null, range, x: (v) => v };
  const label = (v) => (typeof v === "string" ? v : JSON.stringify(v));
  const labels = options
    ? options.map(label)
    : [...new Set(values.filter((v) => v !== undefined).map(label))];
  return { log: false, categories: labels, range: null, x: (v) => labels.indexOf(label(v)) };
}
