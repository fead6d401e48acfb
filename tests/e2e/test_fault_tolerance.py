"""A worker killed mid-job (SIGKILL, as the OOM killer would): its training processes die with it,
the reconciler re-queues the job when its lease expires, and the next attempt resumes from the
last verified checkpoint and finishes, with no metric step recorded twice."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import ace3
from tests.conftest import DigitsFiles, Stack
from tests.e2e.conftest import processes_mentioning, wait_for

pytestmark = pytest.mark.slow


def test_a_killed_worker_s_job_resumes_from_its_checkpoint_on_the_next_worker(
    client: ace3.Client, stack: Stack, digits_files: DigitsFiles
) -> None:
    model = client.load_model(digits_files.model)
    train_data = client.load_dataset(digits_files.train)
    val_data = client.load_dataset(digits_files.validation)
    config = ace3.TrainingConfig(
        num_gpus=2, batch_size=32, save_interval=20, log_interval=5, seed=3
    )
    handle = ace3.DistributedTrainer(config).train(
        model, train_data, validation_dataset=val_data, epochs=25, wait=False
    )
    wait_for(lambda: len(client.jobs.checkpoints(handle.id)) >= 2, 120, "two checkpoints")
    assert processes_mentioning(handle.id)

    stack.kill_worker()
    wait_for(lambda: not processes_mentioning(handle.id), 10, "the orphaned torchrun ranks to exit")
    saved = client.jobs.checkpoints(handle.id)[-1]
    assert handle.refresh().state == "running", "nobody has noticed yet: the lease is still valid"

    stack.start_worker()
    wait_for(lambda: handle.refresh().attempt == 2, 60, "the reconciler to re-queue the job")
    job = handle.wait(timeout=180)
    assert job.job.state == "succeeded" and job.job.attempt == 2

    logs = [line for line in client.jobs.iter_logs(handle.id)]
    assert {line.attempt for line in logs} == {1, 2}
    assert any(
        line.attempt == 2 and "resumed from" in line.line and saved.name in line.line
        for line in logs
    )
    steps = [m.step for m in client.jobs.metrics(handle.id, name="train_loss")]
    assert max(Counter(steps).values()) == 1, "no step is recorded twice"
    with np.load(digits_files.train) as arrays:
        steps_per_epoch = -(-len(arrays["targets"]) // 32)
    assert job.final_metrics["steps"] == 25 * steps_per_epoch
    assert job.best_val_accuracy is not None and job.best_val_accuracy >= 0.9
