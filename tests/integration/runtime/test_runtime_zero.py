"""ZeRO stages 1-3 under real torchrun (gloo, CPU) against a single-process run.

Every run trains the same small MLP on scikit-learn's digits from the same seed with the same
global batch (64, two micro-batches accumulated per optimizer step, clipping at 1.0) for 8
optimizer steps, logging ``train_loss`` at every step. The reference is one process at
zero_stage 0.

Why the curves must agree: ``batch_size`` is global and the loaders give every rank an
interleaved slice of one permutation, so each optimizer step sees the same 128 samples at any
world size; FSDP / DDP average the per-rank gradients, which equals the single-process mean
gradient because the per-rank micro-batches are equal. Only the order of float32 additions
differs (all-reduce / reduce-scatter versus one sum), which moves results by a few ulps per
step; after 8 Adam steps the losses agree to better than ``REL_TOL = 1e-4`` (observed: about
1e-7). A wrong sharding, a missing gradient sync or a skipped micro-batch moves them by
1e-2 or more.

The validation file has 65 samples: with 32 per rank, rank 0 has two validation batches and
rank 1 one, so sharded validation must keep the ranks in lockstep (it would hang otherwise),
and its ``val_loss`` must equal the reference's.
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.warm_runs import WARM_RUNS

pytestmark = pytest.mark.slow

SDK = Path(__file__).resolve().parents[3] / "sdk"
REL_TOL = 1e-4
STEPS = 8

MODEL_FILE = """
from torch import nn


def build_model(hidden=64):
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))
"""


def run_job(
    job: dict[str, Any], job_dir: Path, nproc: int, expect_ok: bool = True
) -> subprocess.CompletedProcess:
    """Write job.json and run it under ``torchrun --standalone`` with ``nproc`` ranks, forked
    from a warm launcher as on a worker (:mod:`tests.warm_runs`), and check that it succeeded
    (or with ``expect_ok=False`` that it failed)."""
    job_dir.mkdir(parents=True, exist_ok=True)
    job = {**job, "output_dir": str(job_dir / "output")}
    (job_dir / "job.json").write_text(json.dumps(job))
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "ACE3_DEVICE": "cpu",
        "PYTHONPATH": os.pathsep.join([str(SDK), os.environ.get("PYTHONPATH", "")]),
    }
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    done = WARM_RUNS.run(str(job_dir / "job.json"), nproc, env)
    assert (done.returncode == 0) == expect_ok, (
        f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    )
    return done


def events(job_dir: Path) -> list[dict[str, Any]]:
    lines = (job_dir / "output" / "events.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def losses(job_dir: Path) -> dict[int, float]:
    return {
        e["step"]: e["values"]["train_loss"]
        for e in events(job_dir)
        if e["type"] == "metrics" and "learning_rate" in e["values"]
    }


def summary(job_dir: Path) -> dict[str, Any]:
    last = events(job_dir)[-1]
    assert last["type"] == "summary"
    return last["final_metrics"]


def assert_curves_agree(got: dict[int, float], want: dict[int, float]) -> None:
    assert sorted(got) == sorted(want), (got, want)
    for step, value in want.items():
        assert got[step] == pytest.approx(value, rel=REL_TOL), (step, got[step], value)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sklearn.datasets import load_digits

    root = tmp_path_factory.mktemp("zero")
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    np.savez(root / "train.npz", X=x[:1280], y=y[:1280])
    np.savez(root / "val.npz", X=x[1280:1345], y=y[1280:1345])  # 65 samples: uneven shards
    (root / "model.py").write_text(MODEL_FILE)
    return root


def job_for(workdir: Path, nproc: int, **config: Any) -> dict[str, Any]:
    return {
        "job_id": "zero",
        "attempt": 1,
        "config": {
            "num_gpus": nproc, "epochs": 1, "max_steps": STEPS, "batch_size": 64,
            "gradient_accumulation_steps": 2, "max_grad_norm": 1.0, "learning_rate": 0.01,
            "log_interval": 1, "seed": 7, **config,
        },
        "model": {"path": str(workdir / "model.py"), "kind": "file",
                  "factory": "build_model", "kwargs": {}},
        "dataset": {"path": str(workdir / "train.npz")},
        "validation_dataset": {"path": str(workdir / "val.npz")},
        "resume_from": None,
    }  # fmt: skip


@pytest.fixture(scope="module")
def reference(workdir: Path) -> Path:
    job_dir = workdir / "reference"
    run_job(job_for(workdir, 1), job_dir, nproc=1)
    assert len(losses(job_dir)) == STEPS
    return job_dir


@pytest.fixture(scope="module")
def stage3_on_2(workdir: Path) -> tuple[Path, str]:
    """Stage 3 on two ranks, with a checkpoint at step 4 (the one resumed elsewhere)."""
    job_dir = workdir / "stage3-2"
    done = run_job(job_for(workdir, 2, zero_stage=3, save_interval=4), job_dir, nproc=2)
    return job_dir, done.stdout


@pytest.mark.parametrize("stage", [1, 2])
def test_stages_1_and_2_on_two_ranks_match_one_process(
    workdir: Path, reference: Path, stage: int
) -> None:
    job_dir = workdir / f"stage{stage}-2"
    done = run_job(job_for(workdir, 2, zero_stage=stage), job_dir, nproc=2)
    assert f"ZeRO stage {stage} over 2 rank(s)" in done.stdout
    assert_curves_agree(losses(job_dir), losses(reference))
    got, want = summary(job_dir), summary(reference)
    assert got["val_loss"] == pytest.approx(want["val_loss"], rel=REL_TOL)
    assert got["val_accuracy"] == want["val_accuracy"]
    # Rank 0 holds less training state than one process does (ZeRO-1 shards the optimizer
    # state by whole parameters, so its share is uneven on a 4-tensor model).
    limit = 0.6 if stage == 2 else 0.95
    assert got["state_memory_mb"] < limit * want["state_memory_mb"]


def test_stage_3_on_two_ranks_matches_one_process_and_writes_a_sharded_checkpoint(
    reference: Path, stage3_on_2: tuple[Path, str]
) -> None:
    job_dir, stdout = stage3_on_2
    assert "ZeRO stage 3 over 2 rank(s)" in stdout and "FSDP units: 2 layer(s)" in stdout
    assert_curves_agree(losses(job_dir), losses(reference))
    got, want = summary(job_dir), summary(reference)
    assert got["val_loss"] == pytest.approx(want["val_loss"], rel=REL_TOL)
    assert got["state_memory_mb"] == pytest.approx(want["state_memory_mb"] / 2, rel=0.05)
    saved = [e for e in events(job_dir) if e["type"] == "checkpoint"]
    assert [e["name"] for e in saved] == ["step-00000004.dcp.tar", "step-00000008.dcp.tar"]
    from ace3.files import sha256_file

    for event in saved:
        path = Path(event["path"])
        assert sha256_file(path) == event["sha256"] and path.stat().st_size == event["size_bytes"]
        with tarfile.open(path) as tar:
            names = set(tar.getnames())
        assert {"train_state.pt", ".metadata", "__0_0.distcp", "__1_0.distcp"} <= names
    leftovers = [p.name for p in (job_dir / "output" / "checkpoints").iterdir()]
    assert sorted(leftovers) == ["step-00000004.dcp.tar", "step-00000008.dcp.tar"]


def test_offload_on_four_ranks_runs_stage_3_and_logs_the_no_op(
    workdir: Path, reference: Path
) -> None:
    """cpu_offload with zero_stage=0 (the document's CPU Offloading settings) runs ZeRO-3;
    on a CPU device offload changes nothing, and says so."""
    job_dir = workdir / "offload-4"
    config = {"cpu_offload": True, "offload_optimizer": True, "offload_parameters": True}
    done = run_job(job_for(workdir, 4, **config), job_dir, nproc=4)
    assert "ZeRO stage 3 over 4 rank(s)" in done.stdout
    assert "stage 3 because offload was asked for with zero_stage=0" in done.stdout
    assert done.stdout.count("offload has no effect on a CPU device") == 1  # rank 0, once
    assert_curves_agree(losses(job_dir), losses(reference))
    got, want = summary(job_dir), summary(reference)
    assert got["val_loss"] == pytest.approx(want["val_loss"], rel=REL_TOL)
    assert got["state_memory_mb"] == pytest.approx(want["state_memory_mb"] / 4, rel=0.1)


@pytest.mark.parametrize("nproc", [1, 4])
def test_a_stage_3_checkpoint_from_two_ranks_resumes_on_another_number(
    workdir: Path, stage3_on_2: tuple[Path, str], nproc: int
) -> None:
    source, _ = stage3_on_2
    checkpoint = source / "output" / "checkpoints" / "step-00000004.dcp.tar"
    job_dir = workdir / f"resume-{nproc}"
    job = job_for(workdir, nproc, zero_stage=3)
    from ace3.files import sha256_file

    job.update(resume_from=str(checkpoint), resume_sha256=sha256_file(checkpoint))
    done = run_job(job, job_dir, nproc=nproc)
    assert "resumed from" in done.stdout and "at step 4" in done.stdout
    assert f"written by 2 process(es) with batch_size 64; this run has {nproc}" in done.stdout
    # It continues where the two-rank run was: steps 5-8 as uninterrupted.
    uninterrupted = losses(source)
    assert_curves_agree(losses(job_dir), {s: v for s, v in uninterrupted.items() if s > 4})
    got, want = summary(job_dir), summary(source)
    assert got["val_loss"] == pytest.approx(want["val_loss"], rel=REL_TOL)
    assert checkpoint.is_file()  # the source is left alone
