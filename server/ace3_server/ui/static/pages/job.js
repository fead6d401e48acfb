// One job: its state (and phase), live curves, live logs (by rank), its Python environment,
// config, attempts and records, checkpoints and artifacts (downloads), Cancel and "Train again
// from this checkpoint".
// Existing points come from GET /metrics; the page then follows the job's event stream
// (metrics_after = the newest metric id it holds) until the job ends or the user leaves.

import { chartControls, LineChart } from "../charts.js";
import {
  clear,
  durationBetween,
  el,
  errorBox,
  formatBytes,
  formatDuration,
  formatNumber,
  formatTime,
  link,
  stateBadge,
  table,
} from "../util.js";
import { environmentPanel, phaseText } from "./job_environment.js";
import { logPanel } from "./job_logs.js";
import { jobLabel, TERMINAL } from "./jobs.js";

export { formatBytes };

export const CHARTS = [
  { metric: "train_loss", title: "Training loss" },
  { metric: "val_loss", title: "Validation loss" },
  { metric: "val_accuracy", title: "Validation accuracy" },
  { metric: "learning_rate", title: "Learning rate" },
];

function card(label, value, attrs = {}) {
  return el("div", { class: "card", ...attrs }, el("div", { class: "label" }, label), el("div", { class: "value" }, value || "—"));
}

// A dataset id as a link to its page (nothing when the job has none).
function datasetLink(id) {
  return id ? link(`#/datasets/${encodeURIComponent(id)}`, id) : null;
}

// What the job was submitted with (the config in full, as the service validated it).
function submitted(job) {
  const { model_id, dataset_id, validation_dataset_id, resume_from_checkpoint, model_kwargs, config } = job;
  return { model_id, dataset_id, validation_dataset_id, resume_from_checkpoint, model_kwargs, config };
}

export async function render(root, { api, params, navigate }) {
  const jobId = params.id;
  const path = `/jobs/${encodeURIComponent(jobId)}`;
  const abort = new AbortController();
  const timers = [];
  let job;
  try {
    job = await api.get(path);
  } catch (error) {
    if (error.status === 404) {
      root.append(
        el("h1", {}, "Job not found"),
        el("p", { class: "muted" }, `No job ${jobId} among your jobs.`),
        el("a", { href: "#/jobs" }, "Back to the jobs"),
      );
      return null;
    }
    throw error;
  }

  // -- header -------------------------------------------------------------------------------
  const title = el("h1", {});
  const cancel = el("button", { id: "job-cancel", type: "button", class: "danger" }, "Cancel");
  const cards = el("div", { class: "cards", id: "job-cards" });
  const problem = el("div", {}); // what an action of this page ran into
  const jobError = el("div", {}); // the job's own error
  cancel.addEventListener("click", async () => {
    if (!window.confirm(`Cancel job ${jobLabel(job)}?`)) return;
    cancel.disabled = true;
    try {
      showJob(await api.post(`${path}/cancel`));
    } catch (error) {
      problem.replaceChildren(errorBox(error));
      cancel.disabled = false;
    }
  });

  function showJob(next) {
    job = next;
    title.replaceChildren(jobLabel(job), " ", stateBadge(job.state));
    title.dataset.state = job.state;
    cancel.hidden = TERMINAL.has(job.state) || job.state === "cancelling";
    const queuedFor = durationBetween(job.created_at, job.started_at || job.finished_at);
    const cardList = [
      card("State", stateBadge(job.state), { id: "job-state", "data-state": job.state }),
    ];
    if (job.phase && !TERMINAL.has(job.state)) {
      cardList.push(card("Phase", phaseText(job), { id: "job-phase", "data-phase": job.phase }));
    }
    cardList.push(
      card("Attempt", String(job.attempt)),
      card("Processes", `${job.num_processes}${job.config?.num_nodes > 1 ? ` on ${job.config.num_nodes} nodes` : ""}`),
      card("Queued for", formatDuration(queuedFor)),
      card("Run time", formatDuration(durationBetween(job.started_at, job.finished_at))),
      card("Created", formatTime(job.created_at)),
      card("Progress", lastStep ? (job.plan?.total_steps ? `step ${lastStep}/${job.plan.total_steps}` : `step ${lastStep}`) : ""),
    );
    if (job.fine_tuned_model_id) {
      // The model the run's Hugging Face export was registered as (train or download it by id).
      cardList.push(card("Fine-tuned model", job.fine_tuned_model_id, { id: "job-fine-tuned-model" }));
    }
    if (typeof job.final_metrics?.trained_tokens === "number") {
      cardList.push(card("Trained tokens", formatNumber(job.final_metrics.trained_tokens)));
    }
    if (typeof job.final_metrics?.best_val_accuracy === "number") {
      cardList.push(card("Best val_accuracy", formatNumber(job.final_metrics.best_val_accuracy)));
    }
    cardList.push(
      card("Dataset", datasetLink(job.dataset_id), { id: "job-dataset" }),
      card("Validation dataset", datasetLink(job.validation_dataset_id), { id: "job-validation-dataset" }),
    );
    cards.replaceChildren(...cardList);
    jobError.replaceChildren(...(job.error ? [el("p", { class: "error", id: "job-error" }, job.error)] : []));
    environment.show(job);
    showAttempts();
  }

  // One row per attempt: the current one's outcome is the job's; an earlier one was preempted
  // (a `preempted` record says at which step) or retried after a lost worker. Its last
  // service line in the log says why.
  const lastServiceLine = new Map(); // attempt -> line
  let preemptedAt = new Map(); // attempt -> step
  function showAttempts() {
    const rows = [];
    for (let attempt = 1; attempt <= Math.max(1, job.attempt); attempt += 1) rows.push(attempt);
    attempts.replaceChildren(
      table(
        [
          { label: "Attempt", value: (attempt) => String(attempt) },
          {
            label: "Outcome",
            value: (attempt) => {
              if (attempt === job.attempt) return stateBadge(job.state);
              if (preemptedAt.has(attempt)) return `preempted after step ${preemptedAt.get(attempt)}`;
              return "ended early; retried";
            },
          },
          { label: "Exit code", value: (attempt) => (attempt === job.attempt && job.exit_code !== null ? String(job.exit_code) : "") },
          { label: "Last service line", value: (attempt) => el("code", {}, lastServiceLine.get(attempt) || "") },
          { label: "Error", value: (attempt) => (attempt === job.attempt ? job.error || "" : "") },
        ],
        rows.reverse(),
      ),
      el("p", { class: "muted" }, `${job.preemptions} preempted attempt(s) (a drained worker; not counted as retries).`),
    );
  }

  // -- charts -------------------------------------------------------------------------------
  const charts = new Map();
  const chartGrid = el("div", { class: "charts" });
  for (const { metric, title: chartTitle } of CHARTS) {
    const container = el("div", { id: `chart-${metric}`, "data-metric": metric });
    chartGrid.append(container);
    charts.set(metric, new LineChart(container, { title: chartTitle }));
  }
  for (const chart of charts.values()) chart.schedule(); // empty axes until the first point
  let metricsAfter = 0;
  let lastStep = 0;
  function addMetric(point) {
    metricsAfter = Math.max(metricsAfter, point.id || 0);
    lastStep = Math.max(lastStep, point.step);
    charts.get(point.name)?.add(point.name, point.step, point.value);
    if (point.name === "epoch_train_loss") charts.get("train_loss").add("epoch_train_loss", point.step, point.value);
  }

  // -- logs ---------------------------------------------------------------------------------
  const logs = logPanel();
  function addLog(log) {
    if (log.stream === "service") {
      lastServiceLine.set(log.attempt, log.line);
      showAttempts();
    }
    logs.add(log);
  }

  // -- attempts, records, checkpoints, artifacts --------------------------------------------
  const attempts = el("div", { id: "job-attempts" });
  const records = el("div", { id: "job-records" });
  const samples = el("div", { id: "job-samples" });
  const checkpoints = el("div", { id: "job-checkpoints" });
  const artifacts = el("div", { id: "job-artifacts" });
  const environment = environmentPanel();

  async function trainAgain(checkpoint) {
    const answer = window.prompt(`Train again from ${checkpoint.name} (step ${checkpoint.step}): epochs in all?`, String(job.config.epochs + 1));
    if (answer === null) return;
    const epochs = Number(answer);
    if (!Number.isInteger(epochs) || epochs < 1) {
      problem.replaceChildren(errorBox(new Error(`epochs must be a whole number from 1, not "${answer}"`)));
      return;
    }
    try {
      const created = await api.post("/jobs", {
        model_id: job.model_id,
        dataset_id: job.dataset_id,
        validation_dataset_id: job.validation_dataset_id,
        config: { ...job.config, epochs },
        model_kwargs: job.model_kwargs,
        name: `${jobLabel(job)} (from ${checkpoint.name})`.slice(0, 200),
        resume_from_checkpoint: checkpoint.id,
      });
      navigate(`#/jobs/${encodeURIComponent(created.id)}`);
    } catch (error) {
      problem.replaceChildren(errorBox(error));
    }
  }

  // A file behind the bearer header: fetched, then handed to the browser.
  function downloadButton(url, filename) {
    const download = () => api.download(url, filename).catch((error) => problem.replaceChildren(errorBox(error)));
    return el("button", { type: "button", class: "download", onclick: download }, "Download");
  }

  async function loadFiles() {
    // (eval_samples apart: up to 256 KiB each, only the latest is shown)
    const [checkpointList, artifactList, instabilityList, preemptedList, latestSamples] = await Promise.all([
      api.get(`${path}/checkpoints`, undefined, abort.signal),
      api.get(`${path}/artifacts`, undefined, abort.signal),
      api.get(`${path}/records`, { type: "instability", limit: 1000 }, abort.signal),
      api.get(`${path}/records`, { type: "preempted", limit: 1000 }, abort.signal),
      api.get(`${path}/records`, { type: "eval_samples", order: "newest", limit: 1 }, abort.signal),
    ]);
    const recordList = { data: [...instabilityList.data, ...preemptedList.data].sort((a, b) => a.id - b.id) };
    showSamples(latestSamples.data[0]);
    checkpoints.replaceChildren(
      table(
        [
          { label: "Name", value: (row) => [row.name, row.best ? el("span", { class: "state state-succeeded" }, "best") : null] },
          { label: "Step", value: (row) => String(row.step) },
          { label: "Epoch", value: (row) => (row.epoch === null ? "" : String(row.epoch)) },
          { label: "Attempt", value: (row) => String(row.attempt) },
          { label: "Size", value: (row) => formatBytes(row.size_bytes) },
          { label: "Created", value: (row) => formatTime(row.created_at) },
          {
            label: "",
            value: (row) => [
              downloadButton(`${path}/checkpoints/${encodeURIComponent(row.id)}/content`, row.name),
              " ",
              el("button", { type: "button", class: "train-again", onclick: () => trainAgain(row) }, "Train again from this checkpoint"),
            ],
          },
        ],
        checkpointList.data,
        { empty: "No checkpoints yet." },
      ),
    );
    artifacts.replaceChildren(
      table(
        [
          { label: "Path", value: (row) => row.path },
          { label: "Size", value: (row) => formatBytes(row.size_bytes) },
          { label: "Version", value: (row) => String(row.version) },
          { label: "Updated", value: (row) => formatTime(row.updated_at) },
          {
            label: "",
            value: (row) =>
              downloadButton(`${path}/artifacts/${row.path.split("/").map(encodeURIComponent).join("/")}`, row.path.split("/").pop()),
          },
        ],
        artifactList.data,
        { empty: "No artifacts." },
      ),
    );
    preemptedAt = new Map(recordList.data.filter((row) => row.type === "preempted").map((row) => [row.attempt, row.step]));
    showAttempts();
    records.replaceChildren(
      table(
        [
          { label: "Attempt", value: (row) => String(row.attempt) },
          { label: "Type", value: (row) => row.type },
          { label: "Step", value: (row) => String(row.step) },
          { label: "Record", value: (row) => el("code", {}, JSON.stringify(row.record)) },
        ],
        recordList.data,
        { empty: "No instability or preemption records." },
      ),
    );
  }

  // The latest eval_prompts completions. A job's output is untrusted: text nodes only (el).
  function showSamples(row) {
    if (!row) {
      samples.replaceChildren(el("p", { class: "empty" }, job.config.eval_prompts ? "No samples yet: written at each validation." : "No eval_prompts in this job's config."));
      return;
    }
    const { step, epoch, samples: items } = row.record;
    samples.replaceChildren(
      el("p", { class: "muted" }, `At step ${step}${epoch === null || epoch === undefined ? "" : `, epoch ${epoch}`} (greedy, at most ${row.record.max_new_tokens} tokens):`),
      ...items.map((item) =>
        el(
          "div",
          { class: "sample" },
          el("pre", { class: "sample-prompt" }, item.prompt),
          el("pre", { class: "sample-completion" }, item.completion, item.truncated ? el("span", { class: "muted" }, " [truncated]") : null),
        ),
      ),
    );
  }

  root.append(
    el("p", { class: "muted crumbs" }, el("a", { href: "#/jobs" }, "Jobs"), " / ", jobId),
    el("div", { class: "page-head" }, title, el("span", { class: "spacer" }), cancel),
    problem,
    jobError,
    cards,
    el("h2", {}, "Curves"),
    chartControls(() => charts.values()),
    chartGrid,
    el("h2", {}, "Logs"),
    logs.node,
    el("h2", {}, "Environment"),
    environment.node,
    el("h2", {}, "Attempts"),
    attempts,
    el("h3", {}, "Records"),
    records,
    el("h2", {}, "Sample completions"),
    samples,
    el("h2", {}, "Checkpoints"),
    checkpoints,
    el("h2", {}, "Artifacts"),
    artifacts,
    el("h2", {}, "Config"),
    el("pre", { class: "config", id: "job-config" }, JSON.stringify(submitted(job), null, 2)),
  );
  showJob(job);

  const existing = await api.get(`${path}/metrics`, undefined, abort.signal);
  for (const point of existing.data) addMetric(point);
  loadFiles().catch((error) => checkpoints.replaceChildren(errorBox(error)));
  if (!TERMINAL.has(job.state)) {
    timers.push(setInterval(() => loadFiles().catch(() => {}), 10_000));
    timers.push(setInterval(() => showJob(job), 1000)); // durations tick
  }

  (async () => {
    try {
      for await (const event of api.events(`${path}/events`, { signal: abort.signal, params: { metrics_after: metricsAfter } })) {
        const data = JSON.parse(event.data);
        if (event.event === "metric") addMetric(data);
        else if (event.event === "log") addLog(data);
        else if (event.event === "state") showJob(data);
        else if (event.event === "record") loadFiles().catch(() => {});
        else if (event.event === "end") {
          showJob(data);
          timers.forEach(clearInterval);
          await loadFiles();
        }
      }
    } catch (error) {
      if (!abort.signal.aborted) problem.replaceChildren(errorBox(error));
    }
  })();

  return () => {
    abort.abort();
    timers.forEach(clearInterval);
    for (const chart of charts.values()) chart.destroy();
    clear(root);
  };
}
