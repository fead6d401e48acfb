"""Batch-size growth through the real stack (API, Postgres, Redis, Celery worker, torchrun with 2
gloo ranks): the job's metrics follow the configured path of effective batch sizes, with the
learning rate scaled linearly along it. (The next attempt after an out-of-memory exit starts
shrunk: tests/unit/runtime/test_batch_growth.py; the worker's retry itself:
tests/e2e/test_fault_tolerance.py.)"""

from __future__ import annotations

import pytest

import ace3
from tests.conftest import DigitsFiles

pytestmark = pytest.mark.slow


def test_a_remote_job_follows_the_batch_size_path(
    client: ace3.Client, digits_files: DigitsFiles
) -> None:
    config = ace3.TrainingConfig(
        num_gpus=2, seed=5, max_steps=6, log_interval=1, validation_split=0, learning_rate=1e-3,
        dynamic_batch_size=ace3.DynamicBatchSizeConfig(
            min_batch_size=8, initial_batch_size=8, target_batch_size=32, stable_steps=2,
            scale_learning_rate="linear",
        ),
    )  # fmt: skip
    assert config.batch_size == 8  # the loader's batch: 4 per rank
    result = ace3.DistributedTrainer(config).train(
        client.load_model(digits_files.model), client.load_dataset(digits_files.train), epochs=1
    )
    job = client.jobs.retrieve(result.job_id)
    assert job.state == "succeeded", job.error
    path = {m.step: m.value for m in client.jobs.metrics(job.id, name="batch_size")}
    assert path == {1: 8, 2: 8, 3: 16, 4: 16, 5: 32, 6: 32}
    rates = {m.step: m.value for m in client.jobs.metrics(job.id, name="learning_rate")}
    assert rates == pytest.approx({step: 1e-3 * size / 8 for step, size in path.items()})
    assert result.final_metrics["batch_size"] == 32 and result.final_metrics["steps"] == 6
    logs = [line.line for line in client.jobs.iter_logs(job.id)]
    assert any("batch size 16 -> 32 from step 5 (2 stable step(s))" in line for line in logs)
