"""One GPU set per job on the real stack: a worker given ``ACE3_WORKER_GPUS=0,1,2,3`` and two
slots runs two 2-process jobs at once, and each launch receives its own two devices as
``CUDA_VISIBLE_DEVICES`` (read back from the ranks' own environment through the job's logs);
while both slots are busy, a third job's message stays in Redis for any worker to take. The
API and that worker have a database of their own: with the fair queue a worker that gets any
message claims the next job it fits, so the shared stack's worker must never see these jobs.

This machine has no GPU: the worker is a CPU worker whose device list is honoured all the same
(the ranks train with gloo on the CPU; the variable is set and harmless), so the assignment is
the code path a CUDA worker runs."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy.orm import Session

import ace3
from ace3_control.db import make_sync_engine
from ace3_control.models import Job
from ace3_control.queue import JobPublisher
from ace3_control.settings import Settings
from tests.conftest import DigitsFiles, Stack, _stop, free_port, fresh_database, stack_env
from tests.e2e.conftest import wait_for

pytestmark = pytest.mark.slow

# Each rank prints the devices it was given; the pause keeps both jobs holding their devices
# at the same time (asserted below from the jobs' rows, not assumed).
MODEL_FILE = """
import os
import time

from torch import nn


def build_model():
    print(f"devices: CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}", flush=True)
    time.sleep(2)
    return nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
"""


@pytest.fixture()
def gpu_stack(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Stack, str]]:
    """(an API, its database URL) with one worker of four listed devices and two slots, on a
    database and a queue of their own."""
    with fresh_database() as database_url:
        stacks = []
        for name in ("gpus-api", "gpus-worker"):
            root = tmp_path_factory.mktemp(name)
            port = free_port()
            stacks.append(
                Stack(
                    f"http://127.0.0.1:{port}", port, stack_env(root, database_url, redis_url), root
                )
            )
        api, worker = stacks
        worker.env.update(
            ACE3_QUEUE_NAME=api.env["ACE3_QUEUE_NAME"],
            ACE3_WORKER_SLOTS="2",
            ACE3_WORKER_GPUS="0,1,2,3",
            ACE3_WORKER_GPU_LOCK_DIR=str(worker.root / "gpu-locks"),
            ACE3_STORAGE_DIR=str(api.root / "storage"),  # (one machine: the API's files)
        )
        worker.start_worker()
        try:
            api.start_api()
            yield api, database_url
        finally:
            for stack in stacks:
                for process in stack.processes.values():
                    _stop(process)


def _insert_jobs(
    database_url: str, owner_id: str, model_id: str, dataset_id: str, count: int
) -> list[str]:
    config = ace3.TrainingConfig(num_gpus=2, batch_size=64, max_steps=2, epochs=1)
    engine = make_sync_engine(database_url, pooled=False)
    with Session(engine) as session:
        jobs = [
            Job(
                owner_id=owner_id,
                model_id=model_id,
                dataset_id=dataset_id,
                config=config.model_dump(mode="json"),
                model_kwargs={},
                num_processes=2,
                request_hash=f"gpu-sets-{secrets.token_hex(4)}",
                max_retries=0,
            )
            for _ in range(count)
        ]
        session.add_all(jobs)
        session.commit()
        job_ids = [job.id for job in jobs]
    engine.dispose()
    return job_ids


def test_concurrent_jobs_each_get_their_own_devices_and_a_busy_worker_holds_no_message(
    gpu_stack: tuple[Stack, str], digits_files: DigitsFiles, tmp_path: Path
) -> None:
    """Two jobs run at once on 0,1 and 2,3; a third, published while both slots are busy, stays
    in Redis (no prefetch: another worker could take it). (Reuse of a released set: the unit
    tests.)"""
    stack, database_url = gpu_stack
    queue = stack.env["ACE3_QUEUE_NAME"]
    key, owner_id = stack.create_key("gpu-sets")
    model_file = tmp_path / "devices_model.py"
    model_file.write_text(MODEL_FILE)
    broker = redis.Redis.from_url(stack.env["ACE3_BROKER_URL"])
    publisher = JobPublisher(Settings(broker_url=stack.env["ACE3_BROKER_URL"], queue_name=queue))
    with ace3.Client(api_key=key, base_url=stack.base_url) as client:
        model = client.load_model(model_file)
        dataset = client.load_dataset(digits_files.train)
        pair = _insert_jobs(database_url, owner_id, model.id, dataset.id, 2)
        for job_id in pair:
            publisher.publish(job_id)

        def states(ids: list[str]) -> list[str]:
            return [client.jobs.retrieve(job_id).state for job_id in ids]

        wait_for(lambda: states(pair) == ["running", "running"], 120, "both jobs to run")
        # (queued only now: the reconciler re-publishes a job left queued for 10 s)
        [third] = _insert_jobs(database_url, owner_id, model.id, dataset.id, 1)
        # (a slot whose message's job the other slot took sends that message again: it waits
        # in the queue too, harmless, so the third's is counted on top of what is there)
        before = broker.llen(queue)
        publisher.publish(third)
        time.sleep(0.5)  # (a prefetching worker takes a message within milliseconds)
        waiting = broker.llen(queue)
        assert states(pair) == ["running", "running"], "(else the reading proves nothing)"
        assert waiting == before + 1, "a worker whose slots are all busy took a queued message"
        publisher.close()
        client.jobs.cancel(third)  # (its message then finds nothing to run: no third training)

        def finished() -> bool:
            return all(state in ("succeeded", "failed") for state in states(pair))

        wait_for(finished, 240, "the jobs to finish")  # (a loaded 2-core machine is slow)
        done = [client.jobs.retrieve(job_id) for job_id in pair]
        assert [job.state for job in done] == ["succeeded"] * 2, [
            (job.error, client.jobs.logs(job.id, limit=50).data[-20:]) for job in done
        ]
        first, second = sorted(done, key=lambda job: str(job.started_at))
        assert second.started_at < first.finished_at, (  # type: ignore[operator]
            "the two jobs must have run at the same time for this test to mean anything"
        )
        seen: dict[str, dict[int, str]] = {}
        for job_id in pair:
            lines = client.jobs.logs(job_id, limit=5000).data
            seen[job_id] = {
                line.rank: line.line.split("=", 1)[1]
                for line in lines
                if line.rank is not None and line.line.startswith("devices: ")
            }
    broker.close()
    sets = [seen[job_id] for job_id in pair]
    assert all(set(ranks) == {0, 1} for ranks in sets), sets
    # Both ranks of a job see the job's whole set (rank i uses cuda:i of it).
    assert all(len(set(ranks.values())) == 1 for ranks in sets), sets
    assert sorted(ranks[0] for ranks in sets) == ["0,1", "2,3"], f"two disjoint sets: {sets}"
