"""Pipeline, layer and tensor parallelism under real torchrun (gloo, CPU) against one process.

Every run trains the same MLP (four ``Linear`` layers in an ``nn.Sequential``) on 600 digits
from the same seed with the same global batch (64, two batches accumulated per optimizer step,
clipping at 1.0) for one epoch: 10 batches, so 5 optimizer steps, the last of which holds a
short batch of 24 samples (the pipeline pads it to the micro-batch grid and does not count the
padding). The reference is one data-parallel process.

Why the curves must agree: every model-parallel rank reads the same batches as the single
process; a pipeline computes each micro-batch's loss as a share of the batch mean, so the
gradients are the same mean gradient; tensor parallelism splits matrix products over ranks and
all-reduces the partial sums. Only the order of float32 additions differs, a few ulps per step;
after 5 AdamW steps the losses agree to better than ``REL_TOL = 1e-4`` (observed: about 1e-7).
A wrong stage order, a dropped micro-batch, a counted padding sample or an unscaled gradient
moves them by 1e-2 or more.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.integration.runtime.test_runtime_zero import events, losses, run_job, summary

pytestmark = pytest.mark.slow

REL_TOL = 1e-4
STEPS = 5

MODEL_FILE = """
from torch import nn


def build_model():
    return nn.Sequential(
        nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
        nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10),
    )
"""


def assert_curves_agree(got: dict[int, float], want: dict[int, float]) -> None:
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1)), (got, want)
    for step, value in want.items():
        assert got[step] == pytest.approx(value, rel=REL_TOL), (step, got[step], value)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sklearn.datasets import load_digits

    root = tmp_path_factory.mktemp("model-parallel")
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    np.savez(root / "train.npz", X=x[:600], y=y[:600])
    np.savez(root / "val.npz", X=x[1280:1345], y=y[1280:1345])  # 65: a short last batch
    (root / "model.py").write_text(MODEL_FILE)
    return root


def job_for(workdir: Path, nproc: int, resume: Path | None = None, **config: Any) -> dict:
    return {
        "job_id": "mp",
        "attempt": 1,
        "config": {
            "num_gpus": nproc, "epochs": 1, "batch_size": 64, "gradient_accumulation_steps": 2,
            "max_grad_norm": 1.0, "learning_rate": 0.01, "log_interval": 1, "seed": 7,
            **config,
        },
        "model": {"path": str(workdir / "model.py"), "kind": "file",
                  "factory": "build_model", "kwargs": {}},
        "dataset": {"path": str(workdir / "train.npz")},
        "validation_dataset": {"path": str(workdir / "val.npz")},
        "resume_from": str(resume) if resume else None,
    }  # fmt: skip


def assert_resumes_along(
    workdir: Path, original: Path, checkpoint: Path, runs: list[tuple[str, int, dict[str, Any]]]
) -> None:
    """Each (name, processes, config) run resumed from ``checkpoint`` (written at step 2)
    continues ``original``'s curve."""
    want = {s: v for s, v in losses(original).items() if s > 2}
    for name, nproc, config in runs:
        out = workdir / name
        run_job(job_for(workdir, nproc, resume=checkpoint, **config), out, nproc)
        got = losses(out)
        assert sorted(got) == sorted(want), (name, got)
        for step, value in want.items():
            assert got[step] == pytest.approx(value, rel=REL_TOL), (name, step)


@pytest.fixture(scope="module")
def reference(workdir: Path) -> Path:
    job_dir = workdir / "reference"
    run_job(job_for(workdir, 1), job_dir, nproc=1)
    return job_dir


def check_against(job_dir: Path, reference: Path) -> None:
    assert_curves_agree(losses(job_dir), losses(reference))
    got, want = summary(job_dir), summary(reference)
    assert got["val_loss"] == pytest.approx(want["val_loss"], rel=REL_TOL)
    assert got["val_accuracy"] == want["val_accuracy"]
    assert got["steps"] == STEPS


@pytest.fixture(scope="module")
def pipeline_1f1b_on_2(workdir: Path) -> tuple[Path, str]:
    job_dir = workdir / "1f1b-2"
    config = {"parallelism": "pipeline", "num_stages": 2, "micro_batch_size": 16,
              "save_interval": 2}  # fmt: skip
    done = run_job(job_for(workdir, 2, **config), job_dir, nproc=2)
    return job_dir, done.stdout


def test_pipeline_1f1b_on_two_ranks_matches_one_process(
    reference: Path, pipeline_1f1b_on_2: tuple[Path, str]
) -> None:
    job_dir, stdout = pipeline_1f1b_on_2
    assert "pipeline parallel: 2 stage(s), 1f1b schedule, 4 micro-batch(es) of 16" in stdout
    assert (
        "stage 0 (rank 0): layers 0-1 (4160 parameters)" in stdout
        and "stage 1 (rank 1): layers 2-6" in stdout
    )
    check_against(job_dir, reference)


@pytest.mark.parametrize(("schedule", "nproc"), [("gpipe", 2), ("1f1b", 4), ("gpipe", 4)])
def test_pipeline_schedules_match_one_process(
    workdir: Path, reference: Path, schedule: str, nproc: int
) -> None:
    job_dir = workdir / f"{schedule}-{nproc}"
    config = {"parallelism": "pipeline", "num_stages": nproc, "micro_batch_size": 16,
              "pipeline_schedule": schedule}  # fmt: skip
    done = run_job(job_for(workdir, nproc, **config), job_dir, nproc=nproc)
    assert f"pipeline parallel: {nproc} stage(s), {schedule} schedule" in done.stdout
    check_against(job_dir, reference)


def test_layer_model_parallel_on_two_ranks_matches_one_process(
    workdir: Path, reference: Path
) -> None:
    job_dir = workdir / "layer-2"
    config = {"parallelism": "model", "model_sharding_strategy": "layer"}
    done = run_job(job_for(workdir, 2, **config), job_dir, nproc=2)
    assert "model parallel (layer): consecutive layers on 2 process(es)" in done.stdout
    check_against(job_dir, reference)


@pytest.mark.parametrize("nproc", [2, 4])
def test_tensor_parallel_matches_one_process(workdir: Path, reference: Path, nproc: int) -> None:
    job_dir = workdir / f"tensor-{nproc}"
    config = {"parallelism": "model", "model_sharding_strategy": "tensor", "save_interval": 5}
    done = run_job(job_for(workdir, nproc, **config), job_dir, nproc=nproc)
    assert f"model parallel (tensor) over {nproc} process(es), automatic plan" in done.stdout
    assert "0: ColwiseParallel, 2: RowwiseParallel, 4: ColwiseParallel" in done.stdout
    check_against(job_dir, reference)
    # The checkpoint holds the gathered full weights under the model's own names.
    import torch

    saved = [e for e in events(job_dir) if e["type"] == "checkpoint"][-1]
    ckpt = torch.load(saved["path"], weights_only=True)
    assert ckpt["model"]["0.weight"].shape == (64, 64) and ckpt["world_size"] == 1
    assert len(ckpt["optimizer"]["state"]) == 8


def test_a_pipeline_checkpoint_resumes_on_the_pipeline_and_on_one_process(
    workdir: Path, reference: Path, pipeline_1f1b_on_2: tuple[Path, str]
) -> None:
    job_dir, _ = pipeline_1f1b_on_2
    saved = {e["step"]: e for e in events(job_dir) if e["type"] == "checkpoint"}
    assert sorted(saved) == [2, 4, 5]
    import torch

    ckpt = torch.load(saved[2]["path"], weights_only=True)
    assert list(ckpt["model"]) == [f"{i}.{k}" for i in (0, 2, 4, 6) for k in ("weight", "bias")]
    assert ckpt["world_size"] == 1 and len(ckpt["optimizer"]["state"]) == 8
    assert_resumes_along(workdir, job_dir, Path(saved[2]["path"]), [
        ("resumed-pipeline", 2, {"parallelism": "pipeline", "num_stages": 2,
                                 "micro_batch_size": 16}),
        ("resumed-data", 1, {}),
    ])  # fmt: skip
    assert json.dumps(summary(workdir / "resumed-pipeline")["steps"]) == str(STEPS)


# -- composed layouts on one DeviceMesh: data x pipeline x tensor ----------------------------------
COMPOSED = {
    "data2-tensor2": {"tensor_parallel_size": 2},
    "data2-pipeline2": {"pipeline_parallel_size": 2, "micro_batch_size": 16},
    "pipeline2-tensor2": {"pipeline_parallel_size": 2, "tensor_parallel_size": 2,
                          "micro_batch_size": 16, "save_interval": 2,
                          "pipeline_split_points": [4]},  # a Linear pair in each stage
    # ZeRO over the replicas: FSDP on the dp dimension (2-D DTensors with the tensor shards).
    "zero3-data2-tensor2": {"tensor_parallel_size": 2, "zero_stage": 3, "save_interval": 2},
    "zero2-data2-pipeline2": {"pipeline_parallel_size": 2, "micro_batch_size": 16,
                              "zero_stage": 2, "save_interval": 2, "save_optimizer": False},
    # ZeRO-2 keeps parameters gathered after validation's forward passes: the final save
    # (after validation) must still see the sharded ones.
    "zero2-data2-tensor2": {"tensor_parallel_size": 2, "zero_stage": 2},
}  # fmt: skip


@pytest.fixture(scope="module")
def composed_runs(workdir: Path) -> dict[str, tuple[Path, str]]:
    runs = {}
    for name, config in COMPOSED.items():
        job_dir = workdir / name
        done = run_job(job_for(workdir, 4, **config), job_dir, nproc=4)
        runs[name] = (job_dir, done.stdout)
    return runs


@pytest.mark.parametrize("name", list(COMPOSED))
def test_composed_layouts_on_four_ranks_match_one_process(
    reference: Path, composed_runs: dict[str, tuple[Path, str]], name: str
) -> None:
    job_dir, stdout = composed_runs[name]
    check_against(job_dir, reference)
    layout = {
        "data2-tensor2": "parallel layout: data 2 x tensor 2 = 4 process(es)",
        "data2-pipeline2": "parallel layout: data 2 x pipeline 2 = 4 process(es)",
        "pipeline2-tensor2": "parallel layout: data 1 x pipeline 2 x tensor 2 = 4 process(es)",
        "zero3-data2-tensor2": "ZeRO stage 3 over 2 rank(s)",
        "zero2-data2-pipeline2": "ZeRO stage 2 over 2 rank(s)",
        "zero2-data2-tensor2": "ZeRO stage 2 over 2 rank(s)",
    }[name]
    assert layout in stdout
    if name == "pipeline2-tensor2":  # each stage's Linear pair sharded over its two ranks
        assert "stage 0: model parallel (tensor) over 2 process(es)" in stdout
        assert "stage 1: model parallel (tensor) over 2 process(es)" in stdout


def test_a_zero_3_data_x_tensor_checkpoint_resumes_sharded_and_on_plain_data_parallel(
    workdir: Path, composed_runs: dict[str, tuple[Path, str]]
) -> None:
    """The gathered checkpoint of 2-D (FSDP x tensor) parameters and optimizer state resumes
    re-sharded on the same layout and unsharded on two plain data-parallel processes."""
    import torch

    job_dir, _ = composed_runs["zero3-data2-tensor2"]
    saved = {e["step"]: e for e in events(job_dir) if e["type"] == "checkpoint"}
    ckpt = torch.load(saved[2]["path"], weights_only=True)
    assert ckpt["model"]["0.weight"].shape == (64, 64) and ckpt["world_size"] == 2
    assert len(ckpt["optimizer"]["state"]) == 8
    assert_resumes_along(workdir, job_dir, Path(saved[2]["path"]), [
        ("resumed-zero3-tensor", 4, COMPOSED["zero3-data2-tensor2"]),
        ("resumed-plain-data", 2, {}),
    ])  # fmt: skip


def test_clipping_takes_the_norm_over_every_stage_and_shard(workdir: Path) -> None:
    """A max_grad_norm that clips every step: the pipeline's stages and the tensor shards
    scale by the whole model's norm, as one process does."""
    reference = workdir / "clipped-reference"
    run_job(job_for(workdir, 1, max_grad_norm=0.05), reference, nproc=1)
    for name, nproc, config in [
        ("clipped-pipeline2", 2, {"parallelism": "pipeline", "num_stages": 2,
                                  "micro_batch_size": 16}),
        ("clipped-pipeline2-tensor2", 4, COMPOSED["pipeline2-tensor2"]),
    ]:  # fmt: skip
        job_dir = workdir / name
        run_job(job_for(workdir, nproc, **{**config, "max_grad_norm": 0.05}), job_dir, nproc)
        assert_curves_agree(losses(job_dir), losses(reference))


def test_data_x_pipeline_x_tensor_on_eight_ranks_matches_one_process(
    workdir: Path, reference: Path
) -> None:
    job_dir = workdir / "data2-pipeline2-tensor2"
    config = {"pipeline_parallel_size": 2, "tensor_parallel_size": 2, "micro_batch_size": 16,
              "pipeline_split_points": [4]}  # fmt: skip
    done = run_job(job_for(workdir, 8, **config), job_dir, nproc=8)
    assert "parallel layout: data 2 x pipeline 2 x tensor 2 = 8 process(es)" in done.stdout
    check_against(job_dir, reference)


def test_a_pipeline_x_tensor_checkpoint_resumes_as_data_x_pipeline_only_with_one_replica(
    workdir: Path, composed_runs: dict[str, tuple[Path, str]]
) -> None:
    import torch

    job_dir, _ = composed_runs["pipeline2-tensor2"]
    saved = {e["step"]: e for e in events(job_dir) if e["type"] == "checkpoint"}
    ckpt = torch.load(saved[2]["path"], weights_only=True)
    # Gathered: full weights under the model's own names, one replica.
    assert ckpt["model"]["0.weight"].shape == (64, 64) and ckpt["world_size"] == 1
    assert ckpt["model_parallel"]["pipeline_parallel_size"] == 2
    assert_resumes_along(workdir, job_dir, Path(saved[2]["path"]), [
        ("resumed-on-tensor-2", 2, {"tensor_parallel_size": 2}),
    ])  # fmt: skip
    # Two replicas cannot continue a one-replica run (each counts its own batches): refused.
    refused = workdir / "refused-two-replicas"
    job = job_for(workdir, 4, resume=Path(saved[2]["path"]), **COMPOSED["data2-pipeline2"])
    failed = run_job(job, refused, nproc=4, expect_ok=False)
    assert "written by a job of 1 data-parallel replica(s) and this job has 2" in (
        failed.stdout + failed.stderr
    )
