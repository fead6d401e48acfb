// DOM helpers. Text from the service (job names, logs, configs) only ever goes in as text
// nodes: never innerHTML.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      node.addEventListener(name.slice(2).toLowerCase(), value);
    } else if (name === "dataset") {
      Object.assign(node.dataset, value);
    } else if (value === true) {
      node.setAttribute(name, "");
    } else {
      node.setAttribute(name, String(value));
    }
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// A table: columns are {label, value: row => text|Node, className?}.
export function table(columns, rows, { empty = "Nothing here yet.", rowAttrs } = {}) {
  if (!rows.length) return el("p", { class: "empty" }, empty);
  return el(
    "table",
    { class: "grid" },
    el("thead", {}, el("tr", {}, columns.map((column) => el("th", {}, column.label)))),
    el(
      "tbody",
      {},
      rows.map((row) =>
        el(
          "tr",
          rowAttrs ? rowAttrs(row) : {},
          columns.map((column) => el("td", { class: column.className }, column.value(row))),
        ),
      ),
    ),
  );
}

export function stateBadge(state) {
  return el("span", { class: `state state-${state}` }, state);
}

export function link(href, text) {
  return el("a", { href }, text);
}

export function formatTime(iso) {
  if (!iso) return "";
  return new Date(iso).toLocaleString();
}

export function formatDuration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

export function formatBytes(bytes) {
  if (bytes === null || bytes === undefined) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${unit ? value.toFixed(1) : value} ${units[unit]}`;
}

export function durationBetween(startIso, endIso) {
  if (!startIso) return null;
  const end = endIso ? new Date(endIso) : new Date();
  return (end - new Date(startIso)) / 1000;
}

export function formatNumber(value, digits = 4) {
  if (value === null || value === undefined) return "";
  if (typeof value !== "number") return String(value);
  if (!Number.isFinite(value)) return String(value);
  return Math.abs(value) >= 1e4 || (Math.abs(value) < 1e-3 && value !== 0)
    ? value.toExponential(2)
    : String(Number(value.toPrecision(digits)));
}

export function errorBox(error) {
  return el("p", { class: "error", role: "alert" }, error?.message || String(error));
}

export function clear(node) {
  while (node.firstChild) node.firstChild.remove();
}

// The "← Newer · page n · Older →" controls of a list read a page at a time with the API's
// cursors, drawn into `pager` (nothing when there is one page): `cursors` holds the cursor of
// each page seen so far (the last one is shown), `page` is the page shown, `show` draws the
// list again once a click moved `cursors`.
export function cursorPager(pager, cursors, page, show) {
  clear(pager);
  if (cursors.length === 1 && !page.next_cursor) return;
  const previous = el("button", { type: "button", disabled: cursors.length === 1 }, "← Newer");
  const next = el("button", { type: "button", disabled: !page.next_cursor }, "Older →");
  previous.addEventListener("click", () => {
    cursors.pop();
    show();
  });
  next.addEventListener("click", () => {
    cursors.push(page.next_cursor);
    show();
  });
  pager.append(previous, el("span", { class: "muted" }, `page ${cursors.length}`), next);
}
