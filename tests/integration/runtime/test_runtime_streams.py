"""Streamed (sharded) datasets through the engine under real torchrun (2 gloo ranks, CPU).

The shards lie in a local directory, every one in place before a run starts (as the worker
leaves them once fetched), so no reader waits; the request files go to a writable directory
beside them. Each run is tiny: a few hundred digits in parquet shards, or a few token windows.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.integration.runtime.test_runtime_torchrun import (
    MODEL_FILE,
    assert_ok,
    events,
    final_weights,
    run_job,
    train_losses,
)
from tests.stream_shards import stream_dataset, write_parquet, write_tokens

pytestmark = pytest.mark.slow

LM_FILE = """
from types import SimpleNamespace

import torch
from torch import nn


class TinyLM(nn.Module):
    def __init__(self, vocab=32, width=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.head = nn.Linear(width, vocab)

    def forward(self, input_ids, labels):
        assert input_ids.dtype == labels.dtype == torch.int64, (input_ids.dtype, labels.dtype)
        assert input_ids.shape == labels.shape and input_ids.shape[1] == 8, input_ids.shape
        logits = self.head(self.embed(input_ids))
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return SimpleNamespace(loss=loss, logits=logits)


def build_model():
    return TinyLM()
"""

DIGIT_SHARDS, SHARD_ROWS = 5, 120  # one shard held out for validation, four to train on


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sklearn.datasets import load_digits

    root = tmp_path_factory.mktemp("streams")
    digits = load_digits()
    inputs = (digits.data / 16.0).astype(np.float32)
    shards = root / "digits"
    shards.mkdir()
    for index in range(DIGIT_SHARDS):
        rows = slice(index * SHARD_ROWS, (index + 1) * SHARD_ROWS)
        write_parquet(
            shards / f"{index:06d}.parquet",
            [list(map(float, row)) for row in inputs[rows]],
            [int(t) for t in digits.target[rows]],
            row_group_size=32,
        )
    tokens = root / "tokens"
    tokens.mkdir()
    for index in range(3):  # a counting sequence the LM can learn: 8 windows of 8 + 1 each
        write_tokens(tokens / f"{index:06d}.bin", [(index + t) % 32 for t in range(8 * 8 + 1)])
    (root / "model.py").write_text(MODEL_FILE)
    (root / "lm.py").write_text(LM_FILE)
    return root


def stream_job(workdir: Path, data: str, model: str = "model.py", **config: Any) -> dict[str, Any]:
    spec = stream_dataset(workdir / data, "parquet" if data == "digits" else "tokens")
    return {
        "job_id": f"stream-{data}",
        "attempt": 1,
        "config": {
            "num_gpus": 2, "batch_size": 32, "learning_rate": 0.01, "log_interval": 5,
            "save_interval": 10, "seed": 7, "shuffle_buffer": 24, **config,
        },
        "model": {"path": str(workdir / model), "kind": "file", "factory": "build_model"},
        "dataset": spec.model_dump(),
        "validation_dataset": None,
        "resume_from": None,
    }  # fmt: skip


def checkpoints(job_dir: Path) -> list[dict[str, Any]]:
    return [e for e in events(job_dir) if e["type"] == "checkpoint"]


@pytest.fixture(scope="module")
def parquet_run(workdir: Path) -> tuple[Path, str]:
    """Two epochs on the parquet shards, no loader workers: (its directory, its output)."""
    job_dir = workdir / "parquet"
    done = run_job(stream_job(workdir, "digits", epochs=2), job_dir)
    assert_ok(done)
    return job_dir, done.stdout


def test_parquet_trains_and_reports_val_accuracy(parquet_run: tuple[Path, str]) -> None:
    job_dir, out = parquet_run
    assert "validation: 1 of the dataset's 5 shards held out" in out
    evs = events(job_dir)
    start = evs[0]
    # 4 shards of 120 rows over 2 readers: 240 samples, 15 batches of 16 per rank an epoch.
    assert (start["steps_per_epoch"], start["epochs"], start["total_steps"]) == (15, 2, 30)
    epoch_ends = [e for e in evs if e["type"] == "metrics" and "val_loss" in e["values"]]
    assert [e["epoch"] for e in epoch_ends] == [1, 2]
    assert epoch_ends[-1]["values"]["val_accuracy"] >= 0.6
    assert evs[-1]["type"] == "summary" and evs[-1]["steps"] == 30
    state = torch.load(Path(checkpoints(job_dir)[0]["path"]), weights_only=True)
    assert len(state["data_per_replica"]) == 2  # the two ranks' loader positions
    assert state["data_per_replica"][1]["batch_in_epoch"] == 10  # (step 10 of epoch 1)


@pytest.mark.parametrize(
    ("num_workers", "layout"),
    [(0, {}), (2, {"zero_stage": 1})],  # a plain .pt checkpoint; a sharded .dcp.tar one
    ids=["plain-no-workers", "sharded-two-workers"],
)
def test_mid_epoch_resume_is_bit_identical(
    workdir: Path, parquet_run: tuple[Path, str], num_workers: int, layout: dict[str, Any]
) -> None:
    name = f"resume-{num_workers}"
    job = stream_job(workdir, "digits", epochs=2, num_workers=num_workers, **layout)
    whole = parquet_run[0]  # (the same job)
    if num_workers or layout:
        whole = workdir / f"{name}-whole"
        assert_ok(run_job(job, whole))
    # From a mid-epoch checkpoint of the undisturbed run that is still kept (10 or 20 of the
    # epochs' 15 batches read), as a worker's retry resumes the same job.
    first = next(c for c in checkpoints(whole) if c["step"] % 15 and Path(c["path"]).exists())
    resumed = {**copy.deepcopy(job), "resume_from": first["path"], "resume_sha256": first["sha256"]}
    done = run_job(resumed, workdir / f"{name}-resumed")
    assert_ok(done)
    assert "resumed from" in done.stdout
    a, b = _final_weights(whole), _final_weights(workdir / f"{name}-resumed")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    later = [(s, v) for s, v in train_losses(events(whole)) if s > first["step"]]
    assert later and train_losses(events(workdir / f"{name}-resumed")) == later


def _final_weights(job_dir: Path) -> dict[str, torch.Tensor]:
    last = checkpoints(job_dir)[-1]
    if last["name"].endswith(".pt"):
        return final_weights(job_dir)
    from ace3.runtime.checkpoint.sharded import consolidate

    return consolidate(Path(last["path"]))["model"]


def test_tokens_cycle_for_max_steps_into_a_language_model(workdir: Path) -> None:
    job_dir = workdir / "tokens"
    job = stream_job(workdir, "tokens", "lm.py", batch_size=8, sequence_length=8, max_steps=7,
                     log_interval=1, save_interval=100)  # fmt: skip
    done = run_job(job, job_dir)
    assert_ok(done)
    evs = events(job_dir)
    # Two train shards of 8 windows, 4 a rank per batch: a pass is 2 steps; 7 steps cycle.
    assert (evs[0]["total_steps"], evs[0]["epochs"]) == (7, 1)
    assert [s for s, _ in train_losses(evs)] == list(range(1, 8))
    assert {e["epoch"] for e in evs if e["type"] == "metrics"} == {1}
    assert "val_loss" in evs[-1]["final_metrics"] and evs[-1]["steps"] == 7
