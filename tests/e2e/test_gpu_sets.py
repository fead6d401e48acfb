"""One GPU set per job on the real stack: a worker given ``ACE3_WORKER_GPUS=0,1,2,3`` and two
slots runs two 2-process jobs at once, and each launch receives its own two devices as
``CUDA_VISIBLE_DEVICES`` (read back from the ranks' own environment through the job's logs).

This machine has no GPU: the worker is a CPU worker whose device list is honoured all the same
(the ranks train with gloo on the CPU; the variable is set and harmless), so the assignment is
the code path a CUDA worker runs."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

import ace3
from ace3_control.db import make_sync_engine
from ace3_control.models import Job
from ace3_control.queue import JobPublisher
from ace3_control.settings import Settings
from tests.conftest import DigitsFiles, Stack
from tests.e2e.conftest import wait_for
from tests.e2e.test_multi_node import _start_worker, _stop_worker

pytestmark = pytest.mark.slow

# Each rank prints the devices it was given; the pause keeps both jobs holding their devices
# at the same time (asserted below from the jobs' rows, not assumed).
MODEL_FILE = """
import os
import time

from torch import nn


def build_model():
    print(f"devices: CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}", flush=True)
    time.sleep(1)
    return nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
"""


@pytest.fixture()
def gpu_worker(stack: Stack, tmp_path: Path) -> Iterator[str]:
    """A worker of four listed devices and two slots, on a queue of its own: its queue name."""
    queue = f"ace3-gpus-{secrets.token_hex(4)}"
    process = _start_worker(
        stack,
        "worker-gpus",
        ACE3_QUEUE_NAME=queue,
        ACE3_WORKER_SLOTS="2",
        ACE3_WORKER_GPUS="0,1,2,3",
        ACE3_WORKER_GPU_LOCK_DIR=str(tmp_path / "gpu-locks"),
    )
    try:
        yield queue
    finally:
        _stop_worker(process)


def test_two_concurrent_jobs_each_get_their_own_devices(
    stack: Stack, gpu_worker: str, database_url: str, digits_files: DigitsFiles, tmp_path: Path
) -> None:
    key, owner_id = stack.create_key("gpu-sets")
    model_file = tmp_path / "devices_model.py"
    model_file.write_text(MODEL_FILE)
    with ace3.Client(api_key=key, base_url=stack.base_url) as client:
        model = client.load_model(model_file)
        dataset = client.load_dataset(digits_files.train)
        config = ace3.TrainingConfig(num_gpus=2, batch_size=64, max_steps=2, epochs=1)
        engine = make_sync_engine(database_url, pooled=False)
        with Session(engine) as session:
            jobs = [
                Job(
                    owner_id=owner_id,
                    model_id=model.id,
                    dataset_id=dataset.id,
                    config=config.model_dump(mode="json"),
                    model_kwargs={},
                    num_processes=2,
                    request_hash=f"gpu-sets-{index}",
                    max_retries=0,
                )
                for index in range(2)
            ]
            session.add_all(jobs)
            session.commit()
            job_ids = [job.id for job in jobs]
        engine.dispose()
        publisher = JobPublisher(
            Settings(broker_url=stack.env["ACE3_BROKER_URL"], queue_name=gpu_worker)
        )
        for job_id in job_ids:
            publisher.publish(job_id)
        publisher.close()

        def finished() -> bool:
            return all(client.jobs.retrieve(j).state in ("succeeded", "failed") for j in job_ids)

        wait_for(finished, 240, "both jobs to finish")  # (a loaded 2-core machine is slow)
        done = [client.jobs.retrieve(job_id) for job_id in job_ids]
        assert [job.state for job in done] == ["succeeded", "succeeded"], [
            (job.error, client.jobs.logs(job.id, limit=50).data[-20:]) for job in done
        ]
        assert all(job.started_at and job.finished_at for job in done)
        first, second = sorted(done, key=lambda job: str(job.started_at))
        assert second.started_at < first.finished_at, (  # type: ignore[operator]
            "the two jobs must have run at the same time for this test to mean anything"
        )

        seen: dict[str, dict[int, str]] = {}
        for job_id in job_ids:
            lines = client.jobs.logs(job_id, limit=5000).data
            seen[job_id] = {
                line.rank: line.line.split("=", 1)[1]
                for line in lines
                if line.rank is not None and line.line.startswith("devices: ")
            }
    sets = [seen[job_id] for job_id in job_ids]
    assert all(set(ranks) == {0, 1} for ranks in sets), sets
    # Both ranks of a job see the job's whole set (rank i uses cuda:i of it).
    assert all(len(set(ranks.values())) == 1 for ranks in sets), sets
    assigned = sorted(ranks[0] for ranks in sets)
    assert assigned == ["0,1", "2,3"], f"two disjoint sets of two: {assigned}"
