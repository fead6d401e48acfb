"""The new optimizers and the polynomial schedule through the real stack (API, Postgres, Redis,
Celery worker, torchrun): Lion, GaLore-AdamW and Adafactor on 2 gloo ranks (DDP), Sophia on one process (its Hessian estimate needs the gradient's
graph), submitted together. Each job succeeds and reports, step by step, the learning rates of
``ace3.schedulers.PolynomialDecayScheduler``; GaLore's checkpoint (its projections saved as
tensors) loads with ``weights_only=True``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import ace3
from tests.conftest import DigitsFiles, load_example

pytestmark = pytest.mark.slow

LR, MIN_LR, WARMUP, TOTAL, POWER = 2e-3, 1e-4, 1, 3, 2.0


def _expected_lr(step: int) -> float:
    """The polynomial schedule's rate at optimizer step ``step`` (1-based), written out."""
    if step <= WARMUP:
        return LR * step / WARMUP
    if step >= TOTAL:
        return MIN_LR
    return (LR - MIN_LR) * (1 - (step - WARMUP) / (TOTAL - WARMUP)) ** POWER + MIN_LR


def _wait(client: ace3.Client, job_ids: list[str], timeout: float = 300) -> list[ace3.Job]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = [client.jobs.retrieve(job_id) for job_id in job_ids]
        if all(job.is_terminal for job in jobs):
            return jobs
        time.sleep(0.5)
    raise AssertionError(f"jobs {job_ids} did not finish in {timeout} s")


def test_new_optimizers_run_as_remote_jobs_with_the_polynomial_schedule(
    client: ace3.Client, digits_files: DigitsFiles, tmp_path: Path
) -> None:
    import torch

    model = client.load_model(digits_files.model)
    train = client.load_dataset(digits_files.train)
    schedule = {
        "name": "polynomial",
        "params": {"warmup_steps": WARMUP, "total_steps": TOTAL, "power": POWER,
                   "min_lr": MIN_LR},
    }  # fmt: skip
    base = {
        "batch_size": 32, "learning_rate": LR, "seed": 0, "log_interval": 1, "max_steps": TOTAL,
        "epochs": 1, "validation_split": 0.0, "lr_scheduler": schedule,
    }  # fmt: skip
    configs = {
        "lion": ace3.TrainingConfig(**base, num_gpus=2, optimizer="lion"),
        "galore_adamw": ace3.TrainingConfig(
            **base, num_gpus=2, optimizer="galore_adamw", galore_rank=4
        ),
        "adafactor": ace3.TrainingConfig(**base, num_gpus=2, optimizer="adafactor"),
        "sophia": ace3.TrainingConfig(**base, num_gpus=1, optimizer="sophia",
                                      sophia_update_period=2),
    }  # fmt: skip
    ids = {
        name: client.jobs.create(model_id=model.id, dataset_id=train.id, config=config).id
        for name, config in configs.items()
    }
    done = dict(zip(ids, _wait(client, list(ids.values())), strict=True))
    expected = [pytest.approx(_expected_lr(step)) for step in range(1, TOTAL + 1)]
    for name, job in done.items():
        assert job.state == "succeeded", f"{name}: {job.error}"
        rates = client.jobs.metrics(job.id, name="learning_rate")
        assert [m.step for m in rates] == [1, 2, 3], name
        assert [m.value for m in rates] == expected, name
        losses = [m.value for m in client.jobs.metrics(job.id, name="train_loss")]
        assert len(losses) == TOTAL and all(loss == loss for loss in losses), name  # no NaN
        print(f"{name}: {(job.finished_at - job.started_at).total_seconds():.1f} s")
    path = client.job(ids["galore_adamw"]).download_checkpoint(to=tmp_path / "galore.pt")
    state = torch.load(path, weights_only=True)
    assert set(state["model"]) == set(load_example("model").build_model().state_dict())
    assert any("projector" in entry for entry in state["optimizer"]["state"].values())
