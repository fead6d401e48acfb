// One dataset: what the service stored (GET /v1/datasets/{id}): its id, kind, format, source
// uri (a dataset registered from a bucket), shard count, bytes, samples and sha256 (for a
// sharded dataset, the digest of its shard manifest).

import { el, formatBytes, formatTime } from "../util.js";
import { countOrUnknown } from "./datasets.js";

function row(field, label, value) {
  return el("tr", { "data-field": field }, el("th", { scope: "row" }, label), el("td", {}, value));
}

export async function render(root, { api, params }) {
  const datasetId = params.id;
  let dataset;
  try {
    dataset = await api.get(`/datasets/${encodeURIComponent(datasetId)}`);
  } catch (error) {
    if (error.status === 404) {
      root.append(
        el("h1", {}, "Dataset not found"),
        el("p", { class: "muted" }, `No dataset ${datasetId} among your datasets.`),
        el("a", { href: "#/datasets" }, "Back to the datasets"),
      );
      return null;
    }
    throw error;
  }
  const sharded = dataset.shard_count !== null && dataset.shard_count !== undefined;
  const bytes = dataset.size_bytes;
  root.append(
    el("p", { class: "muted crumbs" }, el("a", { href: "#/datasets" }, "Datasets"), " / ", dataset.id),
    el("h1", { id: "dataset-name" }, dataset.name || dataset.id),
    el(
      "table",
      { class: "grid fields", id: "dataset-fields" },
      el(
        "tbody",
        {},
        row("id", "Id", el("code", {}, dataset.id)),
        row("kind", "Kind", dataset.kind),
        row("format", "Format", dataset.format),
        row("uri", "URI", dataset.uri ? el("code", {}, dataset.uri) : el("span", { class: "muted" }, "— (uploaded)")),
        dataset.uri ? null : row("filename", "File", dataset.filename),
        row("shard_count", "Shards", sharded ? String(dataset.shard_count) : el("span", { class: "muted" }, "— (not sharded)")),
        row("size_bytes", "Bytes", `${bytes} (${formatBytes(bytes)})`),
        row("samples", "Samples", countOrUnknown(dataset.samples)),
        row("sha256", sharded ? "sha256 (shard manifest)" : "sha256", el("code", {}, dataset.sha256)),
        row("created_at", "Created", formatTime(dataset.created_at)),
      ),
    ),
    el(
      "p",
      { class: "muted" },
      "Train on it: ",
      el("code", {}, `dataset: {id: ${dataset.id}}`),
      " in a job file, or client.datasets.retrieve(id) in Python.",
    ),
  );
  return null;
}
