"""Snippets of the ACE3 document that train on the service: each one as written (placeholders
filled), against the real stack, then a check of what its section claims."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest

import ace3
from tests.conformance.conftest import MODEL_FILE, Service
from tests.conformance.snippets import run_snippet
from tests.conftest import DigitsFiles

COVERED = {
    "Quick Start",
    "Single-Node Multi-GPU",
    "Multi-Node Training",
    "Data Parallel Training",
    "Model Parallel Training",
    "Pipeline Parallel Training",
    "Automatic Mixed Precision",
    "Manual Mixed Precision",
    "Gradient Checkpointing",
    "CPU Offloading",
    "Gradient Accumulation",
    "Learning Rate Scheduling",
    "Automatic Hyperparameter Tuning",
    "Manual Hyperparameter Search",
    "Training Metrics",
    "TensorBoard Integration",
    "Weights & Biases Integration",
    "Built-in Callbacks",
    "Custom Callbacks",
    "Automatic Checkpointing",
    "Resume Training",
    "Profiling Training",
    "Memory Profiling",
}

pytestmark = pytest.mark.slow


def _last_job(trainer: Any) -> ace3.JobHandle:
    assert trainer.last_job is not None
    return trainer.last_job


def _log_text(handle: ace3.JobHandle) -> str:
    return "\n".join(line.line for line in handle.client.jobs.iter_logs(handle.id))


def test_quick_start(service: Service, digits_files: DigitsFiles, tmp_path: Path) -> None:
    names = run_snippet(
        "Quick Start", tmp_path, {"ace3": ace3},
        placeholders={
            '"your-api-key"': repr(service.api_key),
            '"path/to/model.py"': repr(str(MODEL_FILE)),
            '"path/to/dataset"': repr(str(digits_files.train)),
        },
    )  # fmt: skip
    handle = _last_job(names["trainer"])
    job = handle.refresh()
    assert job.state == ace3.JobState.SUCCEEDED
    logs = _log_text(handle)
    assert (
        "world_size=4" in logs and "precision O1 bfloat16 (autocast" in logs
    )  # 4 processes, AMP on CPU
    history = handle.metrics(name="train_loss")
    assert history[-1].value < history[0].value


def test_single_node_multi_gpu_with_nccl_is_refused_on_cpu_workers(
    remote_names: dict[str, Any], tmp_path: Path, digits_files: DigitsFiles
) -> None:
    """backend='nccl' on a cluster without CUDA workers is refused (422 naming backend), never
    swapped for gloo and never queued."""
    client = remote_names["client"]
    names = {**remote_names, "train_data": remote_names["dataset"],
             "val_data": client.load_dataset(str(digits_files.validation))}  # fmt: skip
    deadline = time.monotonic() + 60
    while not client.workers.list():  # admission counts live workers: wait for the test's one
        assert time.monotonic() < deadline, "the test worker never registered"
        time.sleep(0.3)
    before = client.jobs.list().data
    with pytest.raises(ace3.ValidationError, match=r"nccl.*needs a CUDA worker") as caught:
        run_snippet("Single-Node Multi-GPU", tmp_path, names)
    assert [error["loc"] for error in caught.value.errors] == [["body", "config", "backend"]]
    assert client.jobs.list().data == before


def test_multi_node_training_is_refused_when_the_cluster_cannot_run_it(
    remote_names: dict[str, Any], tmp_path: Path
) -> None:
    """4 nodes of 4 GPUs with nccl on a cluster of one CPU worker: the rendezvous settings are
    dropped with a warning (the service assigns them), and the API refuses the job with the
    reasons (422 naming the fields), before anything is queued."""
    client = remote_names["client"]
    deadline = time.monotonic() + 60
    while not client.workers.list():  # admission counts live workers: wait for the test's one
        assert time.monotonic() < deadline, "the test worker never registered"
        time.sleep(0.3)
    before = client.jobs.list().data
    with (
        pytest.warns(UserWarning, match="only apply to local launches"),
        pytest.raises(ace3.ValidationError) as caught,
    ):
        run_snippet("Multi-Node Training", tmp_path, remote_names)
    fields = {tuple(error["loc"]) for error in caught.value.errors}
    assert fields and fields <= {("body", "config", "num_nodes"), ("body", "config", "backend")}
    assert client.jobs.list().data == before


def _loss_falls(handle: ace3.JobHandle) -> None:
    history = [(m.step, m.value) for m in handle.metrics(name="train_loss")]
    assert len(history) >= 2
    assert history[-1][1] < history[0][1]


def test_model_parallel_training(remote_names: dict[str, Any], tmp_path: Path) -> None:
    """The layer strategy on 4 processes: the model's layers in 4 consecutive groups, one per
    process (a pipeline with one micro-batch)."""
    names = run_snippet("Model Parallel Training", tmp_path, remote_names)
    handle = _last_job(names["trainer"])
    assert handle.refresh().state == ace3.JobState.SUCCEEDED
    logs = _log_text(handle)
    assert "world_size=4" in logs
    assert "model parallel (layer): consecutive layers on 4 process(es)" in logs
    assert all(f"stage {i} (rank {i}):" in logs for i in range(4))
    _loss_falls(handle)


def test_pipeline_parallel_training(remote_names: dict[str, Any], tmp_path: Path) -> None:
    """num_stages=4 without num_gpus runs 4 processes, one stage each; batches of 32 (the
    default) in micro-batches of 8 on the default 1F1B schedule, 16 batches accumulated."""
    names = run_snippet("Pipeline Parallel Training", tmp_path, remote_names)
    handle = _last_job(names["trainer"])
    job = handle.refresh()
    assert job.state == ace3.JobState.SUCCEEDED
    logs = _log_text(handle)
    assert "world_size=4" in logs
    assert "pipeline parallel: 4 stage(s), 1f1b schedule, 4 micro-batch(es) of 8" in logs
    # 1293 training samples in batches of 32: 41 batches, 16 per step: 3 steps an epoch.
    assert job.final_metrics["steps"] == 3 * 3
    _loss_falls(handle)


def test_data_parallel_training(remote_names: dict[str, Any], tmp_path: Path) -> None:
    names = run_snippet("Data Parallel Training", tmp_path, remote_names)
    handle = _last_job(names["trainer"])
    assert handle.refresh().state == ace3.JobState.SUCCEEDED
    logs = _log_text(handle)
    assert "world_size=8" in logs
    assert "micro-batches of 32 per rank" in logs  # 256 split over 8 processes


def test_automatic_mixed_precision(remote_names: dict[str, Any], tmp_path: Path) -> None:
    names = run_snippet("Automatic Mixed Precision", tmp_path, remote_names)
    handle = _last_job(names["trainer"])
    assert handle.refresh().state == ace3.JobState.SUCCEEDED
    assert "precision O1 bfloat16 (autocast" in _log_text(handle)


def test_manual_mixed_precision(remote_names: dict[str, Any], tmp_path: Path) -> None:
    names = run_snippet("Manual Mixed Precision", tmp_path, remote_names)
    handle = _last_job(names["trainer"])
    job = handle.refresh()
    assert job.state == ace3.JobState.SUCCEEDED
    assert job.config["amp_level"] == "O2" and job.config["keep_batchnorm_fp32"] is True
    logs = _log_text(handle)
    assert "precision O2 bfloat16 (fp32 master weights, BatchNorm fp32)" in logs


def test_gradient_checkpointing(remote_names: dict[str, Any], tmp_path: Path) -> None:
    names = run_snippet("Gradient Checkpointing", tmp_path, remote_names)
    handle = _last_job(names["trainer"])
    assert handle.refresh().state == ace3.JobState.SUCCEEDED
    assert "4 checkpointed segment(s)" in _log_text(handle)


def test_cpu_offloading(remote_names: dict[str, Any], tmp_path: Path) -> None:
    """Offload with zero_stage left at 0 runs ZeRO-3 (FSDP, CPUOffloadPolicy on GPUs); on a
    CPU worker the state is in CPU memory already, which the log says, and the job trains
    and saves a sharded checkpoint."""
    names = run_snippet("CPU Offloading", tmp_path, remote_names)
    handle = _last_job(names["trainer"])
    job = handle.refresh()
    assert job.state == ace3.JobState.SUCCEEDED
    assert (job.config["cpu_offload"], job.config["offload_parameters"]) == (True, True)
    logs = _log_text(handle)
    assert "ZeRO stage 3 over 1 rank(s)" in logs
    assert "stage 3 because offload was asked for with zero_stage=0" in logs
    assert "offload has no effect on a CPU device" in logs
    history = handle.metrics(name="train_loss")
    assert history[-1].value < history[0].value
    assert job.final_metrics["val_accuracy"] > 0.8
    assert handle.checkpoints()[-1].name.endswith(".dcp.tar")


def test_gradient_accumulation(remote_names: dict[str, Any], tmp_path: Path) -> None:
    names = run_snippet("Gradient Accumulation", tmp_path, remote_names)
    handle = _last_job(names["trainer"])
    job = handle.refresh()
    assert job.state == ace3.JobState.SUCCEEDED
    # 1293 training samples (10% of 1437 held out) in micro-batches of 32, 8 per optimizer
    # step: 41 micro-batches, 6 optimizer steps an epoch.
    assert job.final_metrics["steps"] == 3 * 6


def test_learning_rate_scheduling(remote_names: dict[str, Any], tmp_path: Path) -> None:
    import torch

    local_copy = _live_model()
    optimizer = torch.optim.AdamW(local_copy.parameters(), lr=1e-3)
    names = run_snippet(
        "Learning Rate Scheduling", tmp_path, {**remote_names, "optimizer": optimizer}
    )
    handle = _last_job(names["trainer"])
    job = handle.refresh()
    assert job.config["lr_scheduler"]["name"] == "warmup_cosine"
    lrs = [(m.step, m.value) for m in handle.metrics(name="learning_rate")]
    # Still warming up (1000 warmup steps): the rate grows linearly towards max_lr=1e-3.
    assert all(b[1] > a[1] for a, b in itertools.pairwise(lrs))
    step, lr = lrs[-1]
    assert lr == pytest.approx(1e-3 * step / 1000, rel=0.05)


def _live_model() -> Any:
    namespace: dict[str, Any] = {}
    exec(compile(MODEL_FILE.read_text(), str(MODEL_FILE), "exec"), namespace)
    return namespace["build_model"]()


def test_automatic_hyperparameter_tuning(
    remote_names: dict[str, Any], tmp_path: Path, capsys
) -> None:
    names = run_snippet("Automatic Hyperparameter Tuning", tmp_path, remote_names)
    best = names["best_params"]
    assert set(best) == {"learning_rate", "batch_size", "weight_decay", "dropout"}
    result = best.result
    assert len(result.trials) == 50 and all(t.state == "succeeded" for t in result.trials)
    # No validation dataset was given: every trial validated on a seeded 10% hold-out.
    assert all(t.value is not None for t in result.trials)
    assert result.best_value == max(t.value for t in result.trials) > 0.9
    assert result.best_trial is not None and result.best_trial.value == result.best_value
    assert dict(best) == result.best_params == result.best_trial.params
    assert "Best parameters: {" in capsys.readouterr().out


def test_manual_hyperparameter_search(remote_names: dict[str, Any], tmp_path: Path, capsys) -> None:
    names = run_snippet("Manual Hyperparameter Search", tmp_path, remote_names)
    assert names["best_score"] > 0.9
    assert set(names["best_params"]) == {"learning_rate", "batch_size", "weight_decay"}
    assert "Best score:" in capsys.readouterr().out


def test_training_metrics(remote_names: dict[str, Any], tmp_path: Path) -> None:
    calls = []

    def compute_custom_loss() -> float:
        calls.append(1)
        return 0.25 * len(calls)

    names = run_snippet(
        "Training Metrics", tmp_path, {**remote_names, "compute_custom_loss": compute_custom_loss}
    )
    handle = _last_job(names["trainer"])
    assert handle.refresh().config["log_interval"] == 100
    lines = [json.loads(x) for x in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert lines and all("custom_loss" in line["values"] for line in lines)
    assert any("val_accuracy" in line["values"] for line in lines)


def test_tensorboard_integration(remote_names: dict[str, Any], tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_snippet("TensorBoard Integration", tmp_path, remote_names)
    log_dir = tmp_path / "tensorboard_logs"
    assert list(log_dir.rglob("events.out.tfevents.*")), "no event files were copied locally"
    tags: dict[str, list[str]] = {}
    graph = False
    for events in {p.parent for p in log_dir.rglob("events.out.tfevents.*")}:
        accumulator = EventAccumulator(str(events), size_guidance={"images": 0})
        accumulator.Reload()
        for kind, names in accumulator.Tags().items():
            if isinstance(names, list):
                tags.setdefault(kind, []).extend(names)
        graph = graph or bool(accumulator.Tags().get("graph"))
    assert any("train_loss" in tag for tag in tags.get("scalars", []))
    assert any("val_accuracy" in tag for tag in tags.get("scalars", []))
    assert tags.get("histograms") and tags.get("images") and graph


def test_weights_and_biases_integration(
    remote_names: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    import wandb

    from tests.unit.runtime.test_loggers import read_wandb_records

    try:
        names = run_snippet("Weights & Biases Integration", tmp_path, remote_names)
    finally:
        wandb.teardown()
    assert _last_job(names["trainer"]).refresh().state == ace3.JobState.SUCCEEDED
    runs = list(tmp_path.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(runs) == 1, "wandb wrote no offline run"
    logged: set[str] = set()
    project = None
    for record in read_wandb_records(runs[0]):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            project = record.run.project
        elif kind == "history":
            logged |= {i.key or "/".join(i.nested_key) for i in record.history.item}
    assert project == "my-project"
    assert {"train_loss", "val_accuracy"} <= logged  # the job's metrics, logged from here


def test_built_in_callbacks(remote_names: dict[str, Any], tmp_path: Path) -> None:
    import torch

    names = run_snippet("Built-in Callbacks", tmp_path, remote_names)
    handle = _last_job(names["trainer"])
    assert handle.refresh().state == ace3.JobState.SUCCEEDED
    saved = sorted((tmp_path / "checkpoints").glob("model-*.pt"))
    assert saved, "ModelCheckpoint files were not copied to ./checkpoints"
    val_losses = dict((m.epoch, m.value) for m in handle.metrics(name="val_loss"))
    for path in saved:  # model-{epoch:02d}-{val_loss:.2f}.pt, only for improving epochs
        _, epoch, loss = path.stem.split("-", 2)
        assert float(loss) == pytest.approx(val_losses[float(int(epoch))], abs=0.006)
        checkpoint = torch.load(path, weights_only=True)
        assert "model" in checkpoint and "optimizer" in checkpoint  # save_weights_only=False


def test_custom_callbacks(remote_names: dict[str, Any], tmp_path: Path, capsys) -> None:
    names = run_snippet("Custom Callbacks", tmp_path, remote_names)
    handle = _last_job(names["trainer"])
    job = handle.refresh()
    assert job.state == ace3.JobState.SUCCEEDED
    printed = capsys.readouterr().out
    logs = _log_text(handle)
    for text in ("Starting epoch 1", "Processed batch 0"):
        assert text in logs and text in printed  # in the job's logs and on the console
    accuracies = [m.value for m in handle.metrics(name="val_accuracy")]
    if any(value > 0.95 for value in accuracies):
        assert "Target accuracy reached!" in logs
        first = next(i for i, value in enumerate(accuracies) if value > 0.95)
        assert len(accuracies) == first + 1  # stop_training ended the run after that epoch


def test_automatic_checkpointing(remote_names: dict[str, Any], tmp_path: Path) -> None:
    names = run_snippet("Automatic Checkpointing", tmp_path, remote_names)
    handle = _last_job(names["trainer"])
    stored = {c.sha256: c for c in handle.checkpoints()}
    local = sorted((tmp_path / "checkpoints").glob("step-*.pt"))
    assert local, "checkpoints were not copied to ./checkpoints"
    from ace3.files import sha256_file

    assert all(sha256_file(path) in stored for path in local)
    assert handle.refresh().config["save_interval"] == 1000


def test_resume_training(remote_names: dict[str, Any], tmp_path: Path) -> None:
    first = ace3.Trainer(
        ace3.TrainingConfig(epochs=2),
        checkpoint_config=ace3.CheckpointConfig(save_dir=str(tmp_path / "earlier")),
    )
    earlier = first.train(remote_names["model"], remote_names["dataset"])
    local = sorted((tmp_path / "earlier").glob("step-*.pt"))[-1]
    names = run_snippet(
        "Resume Training", tmp_path, remote_names,
        placeholders={'"./checkpoints/checkpoint-5000.pt"': repr(str(local))},
    )  # fmt: skip
    handle = _last_job(names["trainer"])
    job = handle.refresh()
    assert job.state == ace3.JobState.SUCCEEDED
    steps = sorted({m.step for m in handle.metrics()})
    assert steps[0] > earlier.final_metrics["steps"]  # continued after the checkpoint's step
    assert job.final_metrics["epochs"] == 3


def test_profiling_training(remote_names: dict[str, Any], tmp_path: Path, capsys) -> None:
    trainer = ace3.Trainer(ace3.TrainingConfig(epochs=1))
    run_snippet("Profiling Training", tmp_path, {**remote_names, "trainer": trainer})
    printed = capsys.readouterr().out
    assert "aten::" in printed and "Self CPU" in printed  # torch's own key_averages table
    trace = json.loads((tmp_path / "training_trace.json").read_text())
    assert trace["traceEvents"]
    assert _last_job(trainer).refresh().config["profiler"]["record_shapes"] is True


def test_memory_profiling(remote_names: dict[str, Any], tmp_path: Path, capsys) -> None:
    trainer = ace3.Trainer(ace3.TrainingConfig(epochs=1))
    names = run_snippet("Memory Profiling", tmp_path, {**remote_names, "trainer": trainer})
    stats = names["memory_stats"]
    assert stats.peak_memory_mb > 0 and 0 < stats.efficiency <= 100
    assert "Peak memory usage:" in capsys.readouterr().out
