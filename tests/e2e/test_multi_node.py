"""Multi-node jobs on the real stack with a second worker process on this machine as the second
node: the two workers meet through torchrun's c10d rendezvous (gloo on CPU) and train digits
together; a cancel stops both nodes; a job asking for more nodes than live workers is refused;
a gang that never completes fails with a clear message without starting part of the job."""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select

import ace3
from ace3_control.db import make_sync_engine
from ace3_control.models import Job, JobNode
from ace3_control.queue import JobPublisher
from ace3_control.settings import Settings
from tests.conftest import DigitsFiles, Stack
from tests.e2e.conftest import processes_of_job, wait_for
from tests.wheelhouse import make_wheel

pytestmark = pytest.mark.slow

GANG_WAIT_SECONDS = 3


def _start_worker(stack: Stack, name: str, **overrides: str) -> subprocess.Popen[bytes]:
    """One more ``ace3 worker`` with the stack's settings (database, broker, storage) and a
    work directory of its own; its output goes to ``<stack root>/<name>.log``."""
    env = {
        **stack.env,
        "ACE3_WORKER_SLOTS": "1",
        "ACE3_WORKER_ADVERTISE_HOST": "127.0.0.1",
        "ACE3_WORK_DIR": str(stack.root / f"{name}-jobs"),
        # (it runs nodes of multi-node jobs, which start cold: a sandbox it prepared would only
        # take CPU from the tests' jobs)
        "ACE3_WARM_LAUNCH": "false",
        **overrides,
    }
    log = (stack.root / f"{name}.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "ace3.cli", "worker"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=stack.root,
        start_new_session=True,
    )


def _stop_worker(process: subprocess.Popen[bytes]) -> None:
    """A clean shutdown (the worker deregisters); killed if it hangs."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture(scope="module")
def second_worker(stack: Stack, client: ace3.Client) -> Iterator[subprocess.Popen[bytes]]:
    wait_for(lambda: len(client.workers.list()) >= 1, 60, "the stack's worker to register")
    before = len(client.workers.list())
    process = _start_worker(stack, "worker2")
    try:
        wait_for(lambda: len(client.workers.list()) > before, 60, "the second worker")
        yield process
    finally:
        _stop_worker(process)


@pytest.fixture()
def inputs(client: ace3.Client, digits_files: DigitsFiles) -> dict[str, object]:
    return {
        "model": client.load_model(digits_files.model),
        "train_dataset": client.load_dataset(digits_files.train),
        "validation_dataset": client.load_dataset(digits_files.validation),
    }


def _nodes(database_url: str, job_id: str) -> list[JobNode]:
    engine = make_sync_engine(database_url, pooled=False)
    try:
        with engine.connect() as connection:
            return list(
                connection.execute(
                    select(JobNode).where(JobNode.job_id == job_id).order_by(JobNode.node_rank)
                )
            )
    finally:
        engine.dispose()


def test_a_two_node_job_trains_digits_on_two_workers(
    client: ace3.Client,
    stack: Stack,
    second_worker: subprocess.Popen[bytes],
    inputs: dict[str, object],
    digits_files: DigitsFiles,
    database_url: str,
) -> None:
    # Both nodes need the job's environment (docs/environments.md): built once, by one of them.
    package = f"gangpkg-{secrets.token_hex(3)}"
    make_wheel(stack.root / "wheelhouse", package, "1.0", {"gangpkg/__init__.py": ""})
    config = ace3.DistributedConfig(
        num_gpus=1, num_nodes=2, node_rank=0, master_addr="10.0.0.1", master_port=29500
    ).to_training_config(
        batch_size=64, learning_rate=3e-3, weight_decay=0.01, seed=0, save_interval=40,
        log_interval=5, requirements=[f"{package}==1.0"],
    )  # fmt: skip
    epochs = 8
    with pytest.warns(UserWarning, match="only apply to local launches"):
        result = ace3.DistributedTrainer(config).train(**inputs, epochs=epochs, show_progress=False)

    job = client.jobs.retrieve(result.job_id)
    assert job.state == "succeeded" and job.exit_code == 0 and job.num_processes == 2
    assert job.attempt == 1
    nodes = _nodes(database_url, result.job_id)
    assert [(node.node_rank, node.state, node.exit_code) for node in nodes] == [
        (0, "exited", 0),
        (1, "exited", 0),
    ]
    assert nodes[0].worker_id != nodes[1].worker_id, "two different workers ran the nodes"
    assert nodes[0].endpoint is not None and nodes[0].endpoint.startswith(nodes[0].host + ":")

    logs = client.jobs.logs(result.job_id, limit=5000).data
    assert job.environment is not None and [p.name for p in job.environment.packages] == [package]
    prepared = [
        line.line for line in logs if f"environment {job.environment.hash[:12]}:" in line.line
    ]
    assert sum(": built in" in line for line in prepared) == 1, prepared
    ready = {line.rank: line.line for line in logs if line.line.startswith("ready:")}
    assert set(ready) == {0, 1}, "every rank of both nodes reached the job's logs"
    assert all("world_size=2" in line for line in ready.values())

    steps = [m.step for m in client.jobs.metrics(result.job_id, name="train_loss")]
    assert steps and max(Counter(steps).values()) == 1, "metrics are stored once"
    losses = [m.value for m in client.jobs.metrics(result.job_id, name="train_loss")]
    assert losses[-1] < losses[0]
    checkpoints = client.jobs.checkpoints(result.job_id)
    assert checkpoints and len({c.step for c in checkpoints}) == len(checkpoints)

    with np.load(digits_files.train) as arrays:
        steps_per_epoch = -(-len(arrays["targets"]) // 64)
    assert result.final_metrics["steps"] == epochs * steps_per_epoch
    assert result.best_val_accuracy is not None and result.best_val_accuracy >= 0.85


def test_cancelling_a_two_node_job_stops_both_nodes(
    client: ace3.Client,
    second_worker: subprocess.Popen[bytes],
    inputs: dict[str, object],
    database_url: str,
) -> None:
    config = ace3.TrainingConfig(num_gpus=1, num_nodes=2, batch_size=32, log_interval=5)
    handle = ace3.DistributedTrainer(config).train(**inputs, epochs=500, wait=False)

    def both_ranks_train() -> bool:
        ranks = {line.rank for line in client.jobs.logs(handle.id, limit=5000).data}
        return {0, 1} <= ranks and bool(client.jobs.metrics(handle.id, name="train_loss"))

    wait_for(both_ranks_train, 120, "both nodes to train")
    client.jobs.cancel(handle.id)
    wait_for(lambda: handle.refresh().state == "cancelled", 60, "the job to be cancelled")
    wait_for(lambda: not processes_of_job(handle.id), 20, "every rank of both nodes to exit")
    nodes = _nodes(database_url, handle.id)
    assert [node.state for node in nodes] == ["exited", "exited"]
    assert all(node.stopped for node in nodes), "the service stopped both nodes"


def test_more_nodes_than_live_workers_is_refused_naming_num_nodes(
    client: ace3.Client, second_worker: subprocess.Popen[bytes], inputs: dict[str, object]
) -> None:
    live = len(client.workers.list())
    before = client.jobs.list().data
    config = ace3.TrainingConfig(num_gpus=1, num_nodes=live + 1, batch_size=8 * (live + 1))
    with pytest.raises(ace3.ValidationError, match="num_nodes") as caught:
        ace3.DistributedTrainer(config).train(**inputs, epochs=1, wait=False)
    [error] = caught.value.errors
    assert error["loc"] == ["body", "config", "num_nodes"]
    assert f"only {live} live workers fit one node" in error["msg"]
    assert client.jobs.list().data == before


def test_a_gang_that_never_completes_fails_clearly_and_starts_nothing(
    stack: Stack, database_url: str, digits_files: DigitsFiles
) -> None:
    """The job is published to a queue only one worker consumes, so its second node never
    comes (admission, which counts the API queue's workers, is bypassed by inserting the row)."""
    key, owner_id = stack.create_key("gang-timeout")
    queue = f"ace3-gang-{secrets.token_hex(4)}"
    with ace3.Client(api_key=key, base_url=stack.base_url) as client:
        model = client.load_model(digits_files.model)
        dataset = client.load_dataset(digits_files.train)
        config = ace3.TrainingConfig(num_gpus=1, num_nodes=2)
        engine = make_sync_engine(database_url, pooled=False)
        from sqlalchemy.orm import Session

        with Session(engine) as session:
            job = Job(
                owner_id=owner_id,
                model_id=model.id,
                dataset_id=dataset.id,
                config=config.model_dump(mode="json"),
                model_kwargs={},
                num_processes=config.world_size,
                request_hash="gang-timeout",
                max_retries=0,
            )
            session.add(job)
            session.commit()
            job_id = job.id
        engine.dispose()
        lonely = _start_worker(
            stack,
            "worker-lonely",
            ACE3_QUEUE_NAME=queue,
            ACE3_GANG_WAIT_SECONDS=str(GANG_WAIT_SECONDS),
        )
        try:
            publisher = JobPublisher(Settings(broker_url=stack.env["ACE3_BROKER_URL"],
                                              queue_name=queue))  # fmt: skip
            publisher.publish(job_id)
            publisher.close()
            started = time.monotonic()
            wait_for(
                lambda: client.jobs.retrieve(job_id).state == "failed", 90, "the gang to give up"
            )
        finally:
            _stop_worker(lonely)
        failed = client.jobs.retrieve(job_id)
        assert failed.error is not None
        assert failed.error.startswith(
            f"needed 2 workers for num_nodes=2, only 1 came within {GANG_WAIT_SECONDS} s"
        )
        assert time.monotonic() - started >= GANG_WAIT_SECONDS - 1
        assert client.jobs.logs(job_id).data == [], "no torchrun was started"
    assert not processes_of_job(job_id)
    assert [node.state for node in _nodes(database_url, job_id)] == ["left"]
    assert not Path(stack.root / "worker-lonely-jobs" / job_id).exists()


def test_a_failure_on_one_node_stops_the_other_and_fails_the_job(
    client: ace3.Client,
    second_worker: subprocess.Popen[bytes],
    digits_files: DigitsFiles,
    database_url: str,
    tmp_path: Path,
) -> None:
    broken = tmp_path / "rank_1_fails.py"
    broken.write_text(
        "import os\n\nfrom torch import nn\n\n\n"
        "def build_model(**kwargs):\n"
        "    if os.environ.get('RANK') == '1':\n"
        "        raise ValueError('boom on rank 1 only')\n"
        "    return nn.Sequential(nn.Linear(64, 10))\n"
    )
    train_data = client.load_dataset(digits_files.train)
    config = ace3.TrainingConfig(num_gpus=1, num_nodes=2, batch_size=32)
    with pytest.raises(ace3.JobFailedError) as failure:
        ace3.DistributedTrainer(config).train(
            client.load_model(broken), train_data, epochs=50, show_progress=False
        )
    job = failure.value.job
    assert job.state == "failed" and job.exit_code == 1
    assert re.match(
        r"node [01] \(worker [^)]+\): training exited with code 1: rank 1: ", job.error or ""
    )
    assert "ValueError: boom on rank 1 only" in (job.error or "")
    nodes = _nodes(database_url, job.id)
    assert [node.state for node in nodes] == ["exited", "exited"]
    assert all(node.exit_code != 0 for node in nodes)
    wait_for(lambda: not processes_of_job(job.id), 20, "every rank of both nodes to exit")


def test_a_killed_node_ends_the_attempt_and_the_job_resumes_on_a_new_gang(
    client: ace3.Client,
    stack: Stack,
    second_worker: subprocess.Popen[bytes],
    inputs: dict[str, object],
    digits_files: DigitsFiles,
) -> None:
    """SIGKILL the second worker mid-job (whichever node it holds): the attempt ends on both
    nodes, the job is re-queued, and attempt 2 on a new gang resumes from the checkpoint."""
    config = ace3.TrainingConfig(
        num_gpus=1, num_nodes=2, batch_size=64, save_interval=20, log_interval=5, seed=3
    )
    epochs = 6
    handle = ace3.DistributedTrainer(config).train(**inputs, epochs=epochs, wait=False)
    wait_for(lambda: len(client.jobs.checkpoints(handle.id)) >= 2, 120, "two checkpoints")
    os.killpg(second_worker.pid, signal.SIGKILL)
    second_worker.wait()
    replacement = _start_worker(stack, "worker2b")
    try:
        wait_for(lambda: handle.refresh().attempt == 2, 90, "the job's next attempt")
        saved = client.jobs.checkpoints(handle.id)[-1]  # attempt 1 is over: the newest one
        job = handle.wait(timeout=240)
    finally:
        _stop_worker(replacement)
    assert job.job.state == "succeeded" and job.job.attempt == 2
    logs = list(client.jobs.iter_logs(handle.id))
    assert any(
        line.attempt == 2 and "resumed from" in line.line and saved.name in line.line
        for line in logs
    )
    steps = [m.step for m in client.jobs.metrics(handle.id, name="train_loss")]
    assert max(Counter(steps).values()) == 1, "no step is recorded twice"
    with np.load(digits_files.train) as arrays:
        steps_per_epoch = -(-len(arrays["targets"]) // 64)
    assert job.final_metrics["steps"] == epochs * steps_per_epoch
