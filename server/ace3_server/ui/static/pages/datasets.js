// Datasets: the owner's stored datasets, newest first, a page at a time (the API's cursors):
// uploaded files and directories, and sharded datasets registered from a bucket (remote) or
// uploaded shard by shard (shards), with their format, shard count, size and samples.

import { clear, cursorPager, el, errorBox, formatBytes, formatTime, link, table } from "../util.js";

const PAGE_SIZE = 50;

// A count the API may not know (samples of jsonl/webdataset/tokens shards): "—" when null.
export function countOrUnknown(value) {
  return value === null || value === undefined ? el("span", { class: "muted", title: "not recorded" }, "—") : String(value);
}

export async function render(root, { api }) {
  const body = el("div", { id: "datasets-body" });
  const pager = el("div", { class: "pager" });
  root.append(
    el("h1", {}, "Datasets"),
    el(
      "p",
      { class: "muted" },
      "Uploaded files and directories, and shards registered from a bucket (",
      el("code", {}, "ace3 datasets register s3://bucket/prefix/ --format parquet"),
      ").",
    ),
    body,
    pager,
  );

  const cursors = [null]; // the cursor of each page seen so far; the last one is shown

  async function show() {
    let page;
    try {
      page = await api.get("/datasets", { limit: PAGE_SIZE, cursor: cursors[cursors.length - 1] });
    } catch (error) {
      clear(body);
      body.append(errorBox(error));
      return;
    }
    clear(body);
    body.append(
      table(
        [
          { label: "Name", value: (d) => link(`#/datasets/${encodeURIComponent(d.id)}`, d.name || d.id) },
          { label: "Kind", value: (d) => d.kind },
          { label: "Format", value: (d) => d.format },
          { label: "Shards", value: (d) => countOrUnknown(d.shard_count), className: "num" },
          { label: "Size", value: (d) => formatBytes(d.size_bytes), className: "num" },
          { label: "Samples", value: (d) => countOrUnknown(d.samples), className: "num" },
          { label: "Created", value: (d) => formatTime(d.created_at) },
        ],
        page.data,
        {
          empty: "No datasets yet: upload one with client.load_dataset() or register shards with ace3 datasets register.",
          rowAttrs: (d) => ({ "data-dataset-id": d.id }),
        },
      ),
    );
    cursorPager(pager, cursors, page, show);
  }

  await show();
  return null;
}
