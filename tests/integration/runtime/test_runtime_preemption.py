"""Preemption under real torchrun (2 gloo ranks): a SIGTERM that reaches one rank only (a spot
notice, a rank stopped from outside) stops *both* ranks after the same optimizer step, with a
checkpoint of that step, a ``preempted`` record and ``PREEMPTED_EXIT_CODE`` on every rank."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from ace3.errors import PREEMPTED_EXIT_CODE
from tests.model_files import SLOW_STEP_MODEL_FILE

pytestmark = pytest.mark.slow

SDK = Path(__file__).resolve().parents[3] / "sdk"


def _events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def _children(pid: int) -> list[int]:
    found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(child) for child in found]


def test_sigterm_to_one_rank_stops_both_at_the_same_step_with_a_checkpoint(
    tmp_path: Path,
) -> None:
    from sklearn.datasets import load_digits

    digits = load_digits()
    np.savez(
        tmp_path / "digits.npz",
        X=(digits.data / 16.0).astype(np.float32),
        y=digits.target.astype(np.int64),
    )
    (tmp_path / "model.py").write_text(SLOW_STEP_MODEL_FILE)
    output = tmp_path / "output"
    job = {
        "job_id": "preempted", "attempt": 1,
        "config": {"num_gpus": 2, "epochs": 1, "batch_size": 64, "log_interval": 2,
                   "save_interval": 1000, "seed": 5, "preemption_grace_seconds": 60},
        "model": {"path": str(tmp_path / "model.py"), "kind": "file", "factory": "build_model",
                  "kwargs": {"delay": 0.05}},
        "dataset": {"path": str(tmp_path / "digits.npz")}, "validation_dataset": None,
        "resume_from": None, "output_dir": str(output),
    }  # fmt: skip
    (tmp_path / "job.json").write_text(json.dumps(job))
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "ACE3_DEVICE": "cpu",
        "PYTHONPATH": os.pathsep.join([str(SDK), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", "-m", "ace3.runtime", "--job", str(tmp_path / "job.json")]  # fmt: skip
    torchrun = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.monotonic() + 120
        events = output / "events.jsonl"
        while not any(e["type"] == "metrics" and e["step"] >= 4 for e in _events(events)):
            assert torchrun.poll() is None, torchrun.communicate()[0]
            assert time.monotonic() < deadline, "training did not reach step 4"
            time.sleep(0.1)
        ranks = _children(torchrun.pid)
        assert len(ranks) == 2
        reached = max(e["step"] for e in _events(events) if e["type"] == "metrics")
        # The rank with the higher PID only: the other learns of it through the agreement.
        os.kill(max(ranks), signal.SIGTERM)
        out, _ = torchrun.communicate(timeout=120)
    finally:
        if torchrun.poll() is None:
            torchrun.kill()
            torchrun.wait()

    records = _events(events)
    preempted = [e for e in records if e["type"] == "preempted"]
    assert len(preempted) == 1, out
    step = preempted[0]["step"]
    assert step > reached and step < 26, "stopped mid-run, after the signal"
    assert not any(e["type"] == "summary" for e in records)
    checkpoint = [e for e in records if e["type"] == "checkpoint"]
    assert [(c["step"], c["name"]) for c in checkpoint] == [(step, preempted[0]["checkpoint"])]
    assert torch.load(checkpoint[0]["path"], weights_only=True)["step"] == step
    # Both ranks stopped after the same step, and left with the preemption exit code.
    stopped = f"TrainingPreemptedError: training preempted (SIGTERM) after step {step}:"
    assert f"[rank 0] {stopped}" in out and f"[rank 1] {stopped}" in out, out
    assert out.count(f"exitcode  : {PREEMPTED_EXIT_CODE}") >= 1, out
    assert not any(line.startswith("[rank") and "Traceback" in line for line in out.splitlines())
