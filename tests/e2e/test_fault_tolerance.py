"""A worker killed mid-job (SIGKILL, as the OOM killer would): its training processes die with it,
the reconciler re-queues the job once the worker's registry row goes stale (seconds, not the
lease), and the next attempt resumes from the last verified checkpoint and finishes, with no
metric step recorded twice. A rank killed the same way is retried by its own worker, and the job
ends with exactly the weights of a run that was never interrupted."""

from __future__ import annotations

import os
import secrets
import signal
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

import ace3
from tests.conftest import DigitsFiles, Stack
from tests.e2e.conftest import process_table, processes_of_job, wait_for
from tests.model_files import OOM_ON_RANK_1_MODEL_FILE, SLOW_STEP_MODEL_FILE
from tests.wheelhouse import make_wheel

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
    assert processes_of_job(handle.id)

    stack.kill_worker()
    killed_at = datetime.now(UTC)
    wait_for(lambda: not processes_of_job(handle.id), 10, "the orphaned torchrun ranks to exit")
    saved = client.jobs.checkpoints(handle.id)[-1]
    stack.start_worker()

    # Not the lease (15 s here): the dead worker's registry row stops changing and the
    # reconciler re-queues the job after the staleness window (ace3_control.orphans).
    def second_attempt_started() -> bool:
        job = handle.refresh()
        return job.attempt == 2 and job.started_at is not None and job.started_at > killed_at

    wait_for(second_attempt_started, 60, "the next attempt to start")
    started_at = handle.refresh().started_at
    assert started_at is not None
    recovery = (started_at - killed_at).total_seconds()
    print(f"\nkill -9 of the worker to the next attempt's started_at: {recovery:.1f} s")
    assert recovery < 25, f"the next attempt started {recovery:.1f} s after the kill"
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


def _rank_pid(job_id: str, rank: int) -> int | None:
    """The PID (here) of one rank of a running job: a process of the job whose environment
    names the rank (a cold path's; torchrun's agent has no RANK) or, started by a warm
    launcher, whose name does (its /proc environment is the launcher's)."""
    table = process_table()
    for pid in processes_of_job(job_id):
        info = table.get(pid)
        if info is None:
            continue
        if info.name == f"ace3-rank-{rank}" or (
            f"RANK={rank}".encode() in info.environ
            and b"ace3.runtime" in info.cmdline
            and b"torch.distributed" not in info.cmdline
        ):
            return pid
    return None


def test_a_rank_killed_by_sigkill_is_retried_and_ends_with_the_same_weights(
    client: ace3.Client, digits_files: DigitsFiles, tmp_path: Path, stack: Stack
) -> None:
    import torch

    # (steps of 30 ms: a job that starts warm trains its 115 steps of digits in a second,
    # which could end it before rank 1 is found)
    model_file = tmp_path / "slow_step.py"
    model_file.write_text(SLOW_STEP_MODEL_FILE)
    model = client.load_model(model_file)
    train_data = client.load_dataset(digits_files.train)
    config = ace3.TrainingConfig(num_gpus=2, batch_size=64, save_interval=5, log_interval=5, seed=7)
    trainer = ace3.DistributedTrainer(config)
    kwargs = {"delay": 0.03}
    reference = trainer.train(model, train_data, epochs=5, wait=False, model_kwargs=kwargs)
    # The retried job asks for a package (docs/environments.md): its second attempt finds the
    # environment its first one built in the worker's cache.
    package = f"retrypkg-{secrets.token_hex(3)}"
    make_wheel(stack.root / "wheelhouse", package, "1.0", {"retrypkg/__init__.py": ""})
    with_package = config.model_copy(update={"requirements": [package]})
    handle = ace3.DistributedTrainer(with_package).train(
        model, train_data, epochs=5, wait=False, model_kwargs=kwargs
    )
    wait_for(lambda: len(client.jobs.checkpoints(handle.id)) >= 2, 120, "two checkpoints")
    victim = _rank_pid(handle.id, 1)
    assert victim is not None, "rank 1 of the job runs"
    os.kill(victim, signal.SIGKILL)

    job = handle.wait(timeout=240).job
    assert job.state == "succeeded" and job.attempt == 2, job.error
    notices = [line.line for line in client.jobs.iter_logs(handle.id) if line.stream == "service"]
    assert any("attempt 1 ended: training failed: rank 1 killed by SIGKILL" in n for n in notices)
    assert any(
        line.attempt == 2 and "resumed from" in line.line
        for line in client.jobs.iter_logs(handle.id)
    )
    prepared = [
        (n.attempt, n.line) for n in client.jobs.iter_logs(handle.id) if "environment " in n.line
    ]
    assert [attempt for attempt, line in prepared if ": built in" in line] == [1], prepared
    assert [a for a, line in prepared if "reused from the cache" in line] == [2], prepared
    steps = [m.step for m in client.jobs.metrics(handle.id, name="train_loss")]
    assert max(Counter(steps).values()) == 1, "no step is recorded twice"

    finals = []
    for job_id in (reference.wait(timeout=240).job.id, handle.id):
        final = client.jobs.checkpoints(job_id)[-1]
        target = tmp_path / f"{job_id}.pt"
        client.jobs.download_checkpoint(job_id, final.id, target)
        finals.append(torch.load(target, weights_only=True))
    assert finals[0]["step"] == finals[1]["step"]
    for name, weights in finals[0]["model"].items():
        assert torch.equal(weights, finals[1]["model"][name]), f"{name} differs after the retry"


def test_out_of_memory_on_one_rank_is_retried_from_the_checkpoint_with_half_the_micro_batch(
    client: ace3.Client, digits_files: DigitsFiles, tmp_path: Path
) -> None:
    """Rank 1 runs out of memory at step 7 (after checkpoints at steps 3 and 6): the attempt
    ends on every rank without hanging, and the next one resumes from step 6 with micro-batches
    of 16 instead of 32 per rank, finishing the planned steps at the same effective batch."""
    (tmp_path / "oom_model.py").write_text(OOM_ON_RANK_1_MODEL_FILE)
    model = client.load_model(tmp_path / "oom_model.py")
    train_data = client.load_dataset(digits_files.train)
    config = ace3.TrainingConfig(
        num_gpus=2, batch_size=64, save_interval=3, log_interval=3, seed=5, max_steps=12,
        validation_split=0,
    )  # fmt: skip
    result = ace3.DistributedTrainer(config).train(
        model, train_data, epochs=1, model_kwargs={"limit": 16, "after": 6}
    )
    job = client.jobs.retrieve(result.job_id)
    assert job.state == "succeeded" and job.attempt == 2, job.error
    assert result.final_metrics["steps"] == 12 and result.final_metrics["micro_batch_split"] == 2
    logs = list(client.jobs.iter_logs(job.id))
    assert any(
        line.rank == 1 and "StepOutOfMemoryError: out of memory at step 7" in line.line
        for line in logs
    )
    assert any(
        line.stream == "service"
        and "attempt 1 ran out of memory inside a training step; the next one runs micro-batch "
        "split 2"
        in line.line
        for line in logs
    )
    assert any(
        line.attempt == 2 and "resumed from" in line.line and "step-00000006" in line.line
        for line in logs
    )
    steps = [m.step for m in client.jobs.metrics(job.id, name="train_loss")]
    assert max(Counter(steps).values()) == 1, "no step is recorded twice"
