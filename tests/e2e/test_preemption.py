"""A worker drained mid-job (SIGTERM to ``ace3 worker``, as a spot-instance notice or a
scale-down sends): it stops claiming jobs, preempts its attempt (the ranks finish their step,
agree on it and checkpoint it), stores that checkpoint, re-queues the job without using up its
retry budget, and exits. Another worker process resumes the job from that checkpoint, and it
ends bit-identical to a run that was never interrupted (the same weights, the same losses)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

import ace3
from tests.conftest import DigitsFiles, Stack
from tests.e2e.conftest import wait_for
from tests.model_files import SLOW_STEP_MODEL_FILE

pytestmark = pytest.mark.slow

EPOCHS = 3  # 21 optimizer steps an epoch (digits, batch 64)


def _last_step(client: ace3.Client, job_id: str) -> int:
    return max((m.step for m in client.jobs.metrics(job_id, name="train_loss")), default=0)


def test_a_drained_worker_s_job_resumes_elsewhere_from_its_preemption_checkpoint(
    client: ace3.Client, stack: Stack, digits_files: DigitsFiles, tmp_path: Path
) -> None:
    model_file = tmp_path / "slow_model.py"
    model_file.write_text(SLOW_STEP_MODEL_FILE)
    model = client.load_model(model_file)
    train_data = client.load_dataset(digits_files.train)
    config = ace3.TrainingConfig(
        num_gpus=2, batch_size=64, log_interval=2, save_interval=1000, seed=11,
        preemption_grace_seconds=60,
    )  # fmt: skip
    trainer = ace3.DistributedTrainer(config)
    # The reference runs at full speed (no sleep: the same arithmetic) and ends before the
    # drain; the other sleeps in every step, so the drain lands mid-run.
    reference = trainer.train(
        model, train_data, epochs=EPOCHS, wait=False, model_kwargs={"delay": 0.0}
    )
    handle = trainer.train(
        model, train_data, epochs=EPOCHS, wait=False, model_kwargs={"delay": 0.15}
    )
    ref = reference.wait(timeout=240).job
    assert ref.state == "succeeded" and ref.attempt == 1 and ref.preemptions == 0
    wait_for(lambda: _last_step(client, handle.id) >= 3, 120, "the job to train a few steps")
    assert handle.refresh().state == "running"

    drained = stack.processes["worker"]
    drained.send_signal(signal.SIGTERM)  # the worker's main process, as systemd or a spot agent
    stack.start_worker()  # another worker process: the job resumes there
    assert drained.wait(timeout=90) == 0, stack.log_tail("worker")

    job = handle.wait(timeout=240).job
    assert job.state == "succeeded", job.error
    assert job.attempt == 2 and job.preemptions == 1, "re-queued once, as a preemption"
    assert job.attempt - 1 - job.preemptions == 0, "no retry of the budget was used"

    logs = list(client.jobs.iter_logs(handle.id))
    service = [line.line for line in logs if line.stream == "service"]
    preempted_at = [
        int(line.split("after step ")[1].split(":")[0])
        for line in service
        if "the run was preempted (SIGTERM) after step" in line
    ]
    assert len(preempted_at) == 1, service
    step = preempted_at[0]
    checkpoints = client.jobs.checkpoints(handle.id)
    saved = next(c for c in checkpoints if c.step == step)
    steps = job.final_metrics["steps"]
    assert saved.attempt == 1 and 3 <= step < steps, "a checkpoint written mid-run"
    (record,) = client.jobs.records(handle.id, type="preempted")  # the typed record too
    assert record.attempt == 1 and (record.step, record.record.checkpoint) == (step, saved.name)
    assert any(
        f"attempt 1 was preempted (the worker is draining); the next attempt resumes from "
        f"checkpoint {saved.name} (step {step}); re-queued" in line
        for line in service
    ), service
    assert any(
        line.attempt == 2 and "resumed from" in line.line and saved.name in line.line
        for line in logs
    )

    # The same reported losses at the same steps, and the same final weights.
    losses = [
        [(m.step, m.value) for m in client.jobs.metrics(job_id, name="train_loss")]
        for job_id in (ref.id, job.id)
    ]
    assert losses[0] == losses[1] and losses[0][-1][0] == steps
    finals = []
    for job_id in (ref.id, job.id):
        final = client.jobs.checkpoints(job_id)[-1]
        target = tmp_path / f"{job_id}.pt"
        client.jobs.download_checkpoint(job_id, final.id, target)
        finals.append(torch.load(target, weights_only=True))
    assert finals[0]["step"] == finals[1]["step"] == steps
    for name, weights in finals[0]["model"].items():
        assert torch.equal(weights, finals[1]["model"][name]), f"{name} differs after resuming"
    figures = [
        {k: v for k, v in j.final_metrics.items() if "memory" not in k and "per_sec" not in k}
        for j in (ref, job)
    ]
    assert figures[0] == figures[1]
