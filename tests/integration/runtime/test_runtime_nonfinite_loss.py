"""A NaN training loss under real torchrun (2 gloo ranks, CPU): both ranks stop at the same
metrics report with :class:`ace3.errors.NonFiniteLossError`, and rank 0 records where it began.

Only rank 1's loss becomes NaN (at step 5); rank 0's follows a step later through the averaged
gradients. The ranks must agree on the earliest step and stop together: a rank that stopped
alone would leave the other waiting in its next collective.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from tests.integration.runtime.test_runtime_torchrun import events, run_job

pytestmark = pytest.mark.slow

MODEL_FILE = """
import os

from torch import nn


class NanOnRankOne(nn.Module):
    def __init__(self, bad_step):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        self.bad_step, self.forwards = bad_step, 0

    def forward(self, x):
        out = self.net(x)
        if self.training:
            self.forwards += 1  # one forward pass per optimizer step here
            if self.forwards == self.bad_step and os.environ["RANK"] == "1":
                out = out * float("nan")
        return out


def build_model(bad_step=5):
    return NanOnRankOne(bad_step)
"""

MESSAGE = (
    "ace3.errors.NonFiniteLossError: training loss became nan at step 5 (reported at step 8); "
    "lower the learning rate, enable gradient clipping (max_grad_norm) or loss scaling"
)


def test_nan_loss_on_one_rank_stops_both_with_the_step_where_it_began(tmp_path: Path) -> None:
    generator = np.random.default_rng(0)
    np.savez(
        tmp_path / "data.npz",
        X=generator.standard_normal((256, 8)).astype(np.float32),
        y=generator.integers(0, 3, 256).astype(np.int64),
    )
    (tmp_path / "model.py").write_text(MODEL_FILE)
    job = {
        "job_id": "nan", "attempt": 1,
        "config": {"num_gpus": 2, "epochs": 1, "batch_size": 16, "validation_split": 0.0,
                   "log_interval": 4, "save_interval": 100, "seed": 0},
        "model": {"path": str(tmp_path / "model.py"), "kind": "file",
                  "factory": "build_model", "kwargs": {"bad_step": 5}},
        "dataset": {"path": str(tmp_path / "data.npz")},
        "validation_dataset": None, "resume_from": None,
    }  # fmt: skip
    started = time.monotonic()
    done = run_job(job, tmp_path / "job")
    assert time.monotonic() - started < 90, "a rank waited in a collective"
    assert done.returncode != 0
    for rank in (0, 1):
        assert f"[rank {rank}] {MESSAGE}" in done.stderr, done.stderr[-4000:]
    records = events(tmp_path / "job")
    assert records[0] == {
        "type": "start", "total_steps": 16, "steps_per_epoch": 16, "epochs": 1,
        "world_size": 2, "resumed_from_step": 0,
    }  # fmt: skip
    # (each rank that raised then appends its rank_failure record: the root cause's time)
    failures = [r for r in records if r["type"] == "rank_failure"]
    assert {r["rank"] for r in failures} <= {0, 1} and failures, records[-3:]
    assert all(r["error_type"] == "ace3.errors.NonFiniteLossError" for r in failures), failures
    assert [r for r in records if r["type"] != "rank_failure"][-1] == {
        "type": "nonfinite_loss", "step": 5, "reported_at_step": 8, "epoch": 1,
        "metric": "train_loss", "value": "nan",
    }  # fmt: skip
    assert [r["step"] for r in records if r["type"] == "metrics"] == [1, 4, 8]
    assert "summary" not in {r["type"] for r in records}
