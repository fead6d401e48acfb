"""The failure's headline is the rank that failed first, under real torchrun (2 gloo ranks).

Rank 0 raises in the user's forward (a ``ValueError``, or ``OSError`` ENOSPC as a full disk
would) a second after rank 1 entered the gradient all-reduce of the same step; rank 1 then
fails on the closed connection ("Connection closed by peer"), often the last to write to
stderr. Each rank appends its own ``rank_failure`` record, and the worker's message, built
from the records as the worker reads them (validated, through :class:`EventTail`), names
rank 0's error first and rank 1's after it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ace3.config.events import RankFailureRecord
from ace3_worker.failures import failure_message, root_cause
from ace3_worker.reports import EventTail, parse_log_line
from tests.integration.runtime.test_runtime_zero import run_job

pytestmark = pytest.mark.slow

MODEL_FILE = """
import errno
import time

import torch
from torch import nn


class FailsOnRankZero(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(8, 2)
        self.calls = 0

    def forward(self, x):
        if self.training:
            self.calls += 1
            if self.calls == 3 and torch.distributed.get_rank() == 0:
                time.sleep(1.0)  # (rank 1 waits in step 3's all-reduce meanwhile)
                if ERROR == "disk":
                    raise OSError(errno.ENOSPC, "No space left on device")
                raise ValueError("rank zero's own bug")
        return self.layer(x)


def build_model():
    return FailsOnRankZero()
"""


@pytest.mark.parametrize(
    ("error", "headline"),
    [
        ("value", "rank 0: ValueError: rank zero's own bug"),
        ("disk", "rank 0: OSError: [Errno 28] No space left on device"),
    ],
)
def test_the_first_failure_is_the_headline(tmp_path: Path, error: str, headline: str) -> None:
    rng = np.random.default_rng(0)
    np.savez(
        tmp_path / "train.npz",
        X=rng.normal(size=(256, 8)).astype(np.float32),
        y=rng.integers(0, 2, 256).astype(np.int64),
    )
    (tmp_path / "model.py").write_text(f"ERROR = {error!r}\n" + MODEL_FILE)
    job = {
        "job_id": "fails",
        "attempt": 1,
        "config": {"num_gpus": 2, "epochs": 1, "max_steps": 8, "batch_size": 16, "seed": 1},
        "model": {"path": str(tmp_path / "model.py"), "kind": "file",
                  "factory": "build_model", "kwargs": {}},
        "dataset": {"path": str(tmp_path / "train.npz")},
        "validation_dataset": None,
        "resume_from": None,
    }  # fmt: skip
    done = run_job(job, tmp_path / "job", nproc=2, expect_ok=False)

    records = [
        record
        for record in EventTail(tmp_path / "job" / "output").read_new()
        if isinstance(record, RankFailureRecord)
    ]
    assert sorted(record.rank for record in records) == [0, 1], done.stderr
    rank_lines: list[tuple[int, str]] = []
    launcher_lines: list[str] = []
    for raw in done.stderr.splitlines():
        line = parse_log_line("stderr", raw)
        if line.rank is None:
            launcher_lines.append(line.line)
        else:
            rank_lines.append((line.rank, line.line))
    cause = root_cause(launcher_lines, rank_lines)
    message = failure_message(done.returncode, rank_lines, launcher_lines, cause, None, records)
    lines = message.splitlines()
    assert lines[0] == f"training exited with code 1: {headline}", message
    assert lines[1].startswith("then rank 1, "), message
