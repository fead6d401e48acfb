// Line charts over the vendored uPlot (window.uPlot). A chart holds named series of
// (step, value) points, joins them on the step axis, and redraws at most once a frame.
// The container's data-points attribute counts the points drawn (the browser tests read it).

import { el } from "./util.js";

const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];

// TensorBoard-style exponential moving average, debiased so the first points are not pulled to 0.
export function smooth(values, weight) {
  if (!weight) return values;
  let last = 0;
  let count = 0;
  return values.map((value) => {
    if (value === null || !Number.isFinite(value)) return value;
    last = last * weight + (1 - weight) * value;
    count += 1;
    return last / (1 - weight ** count);
  });
}

export class LineChart {
  constructor(container, { title = "", height = 240, xLabel = "step" } = {}) {
    this.container = container;
    this.title = title;
    this.height = height;
    this.xLabel = xLabel;
    this.series = new Map(); // name -> Map(step -> value)
    this.smoothing = 0;
    this.logScale = false;
    this.plot = null;
    this.shape = "";
    this.pending = false;
    this.container.classList.add("chart");
    this.container.dataset.points = "0";
    this.resize = new ResizeObserver(() => this.plot?.setSize(this.size()));
    this.resize.observe(this.container);
  }

  size() {
    return { width: Math.max(this.container.clientWidth, 200), height: this.height };
  }

  // Add a point; the first value reported for a step wins (as the service keeps it).
  add(name, step, value) {
    if (!this.series.has(name)) this.series.set(name, new Map());
    const points = this.series.get(name);
    if (!points.has(step)) points.set(step, value);
    this.schedule();
  }

  setSeries(name, points) {
    this.series.set(name, new Map(points));
    this.schedule();
  }

  setSmoothing(weight) {
    this.smoothing = weight;
    this.schedule();
  }

  setLogScale(on) {
    this.logScale = on;
    this.shape = ""; // the scale's distribution is fixed at creation
    this.schedule();
  }

  schedule() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      this.draw();
    });
  }

  data() {
    const names = [...this.series.keys()];
    const tables = names.map((name) => {
      const entries = [...this.series.get(name).entries()]
        .filter(([, value]) => !this.logScale || value > 0)
        .sort((a, b) => a[0] - b[0]);
      return [entries.map(([step]) => step), smooth(entries.map(([, value]) => value), this.smoothing)];
    });
    if (!tables.length) return { names, data: [[]] };
    return { names, data: tables.length === 1 ? tables[0] : window.uPlot.join(tables) };
  }

  draw() {
    const { names, data } = this.data();
    const points = [...this.series.values()].reduce((total, points) => total + points.size, 0);
    this.container.dataset.points = String(points);
    const shape = `${names.join("\u0000")}|${this.logScale}`;
    if (this.plot && shape === this.shape) {
      this.plot.setData(data);
      return;
    }
    this.plot?.destroy();
    this.shape = shape;
    const options = {
      title: this.title,
      ...this.size(),
      scales: { x: { time: false }, y: this.logScale ? { distr: 3 } : {} },
      axes: [{ label: this.xLabel }, {}],
      series: [
        { label: this.xLabel },
        ...names.map((name, index) => ({
          label: name,
          stroke: COLORS[index % COLORS.length],
          width: 1.5,
          spanGaps: true,
          points: { show: false },
        })),
      ],
      legend: { live: true },
    };
    this.plot = new window.uPlot(options, data, this.container);
  }

  destroy() {
    this.resize.disconnect();
    this.plot?.destroy();
    this.plot = null;
  }
}

// The smoothing slider and log-scale box that steer a set of charts.
export function chartControls(charts) {
  const smoothing = el("input", { type: "range", min: "0", max: "0.99", step: "0.01", value: "0", "aria-label": "Smoothing" });
  const value = el("span", { class: "muted" }, "0");
  smoothing.addEventListener("input", () => {
    value.textContent = smoothing.value;
    for (const chart of charts()) chart.setSmoothing(Number(smoothing.value));
  });
  const log = el("input", { type: "checkbox", "aria-label": "Log scale" });
  log.addEventListener("change", () => {
    for (const chart of charts()) chart.setLogScale(log.checked);
  });
  return el(
    "div",
    { class: "chart-controls" },
    el("label", {}, "Smoothing ", smoothing, " ", value),
    el("label", {}, log, " Log scale"),
  );
}
