"""A worker that cannot fit a job never claims it: it hands the job back to the queue (a real
message on the embedded filesystem broker, delayed), once per interval, and never fails it."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from ace3_control.models import Job, utcnow
from ace3_control.settings import Settings
from ace3_server.migrations_check import upgrade
from ace3_worker.device import local_capacity
from ace3_worker.supervisor import Supervisor
from tests.conftest import insert_job


@pytest.fixture()
def supervisor(tmp_path: Path) -> Supervisor:
    settings = Settings(
        data_dir=tmp_path,
        worker_device="cpu",
        worker_cpu_processes=2,
        unfit_republish_seconds=30,
        queue_name="unfit-test",
    )
    upgrade(settings.resolved_database_url)
    return Supervisor(settings)


def _job(supervisor: Supervisor, processes: int, backend: str = "auto") -> Job:
    with supervisor.sessions() as session:
        job = insert_job(
            session, num_processes=processes, config={"num_gpus": processes, "backend": backend}
        )
        session.execute(
            update(Job).where(Job.id == job.id).values(enqueued_at=utcnow() - timedelta(minutes=5))
        )
        session.commit()
        return job


def _reread(supervisor: Supervisor, job_id: str) -> Job:
    with supervisor.sessions() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job


def _messages(supervisor: Supervisor) -> list[dict[str, Any]]:
    folder = supervisor.settings.broker_dir / "out"
    return [json.loads(path.read_text()) for path in sorted(folder.glob("*"))]


def test_the_worker_advertises_its_cpu_processes(supervisor: Supervisor) -> None:
    capacity = local_capacity(supervisor.settings)
    assert (capacity.device_kind, capacity.device_count) == ("cpu", 2)


@pytest.mark.parametrize(("processes", "backend"), [(3, "auto"), (1, "nccl")])
def test_an_unfit_job_is_handed_back_not_claimed_nor_failed(
    supervisor: Supervisor, processes: int, backend: str
) -> None:
    job = _job(supervisor, processes, backend)
    supervisor.run(job.id)
    after = _reread(supervisor, job.id)
    assert (after.state, after.attempt, after.worker_id, after.error) == ("queued", 0, None, None)
    assert after.enqueued_at > utcnow() - timedelta(seconds=30), "the reconciler adds no copy"
    [message] = _messages(supervisor)
    headers = message["headers"]
    assert headers["task"] == "ace3.run_job" and job.id in headers["argsrepr"]
    eta = datetime.fromisoformat(headers["eta"])
    assert eta > utcnow() + timedelta(seconds=25), "handed back with the backoff, not at once"


def test_a_second_copy_within_the_interval_is_dropped(supervisor: Supervisor) -> None:
    job = _job(supervisor, 4)
    supervisor.run(job.id)
    supervisor.run(job.id)  # a duplicate message (e.g. the reconciler's) arrives at once
    assert len(_messages(supervisor)) == 1
    assert _reread(supervisor, job.id).state == "queued"


def test_a_job_that_fits_is_claimed(
    supervisor: Supervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = _job(supervisor, 2)
    claimed: list[tuple[str, int]] = []

    def claim_only(membership: Any, identity: Any, devices: Any, warm: Any) -> None:
        # Stop before launching torchrun: the claim is what is tested.
        claimed.append((membership.job_id, membership.attempt))

    monkeypatch.setattr(supervisor.runner, "run", claim_only)
    supervisor.run(job.id)
    assert claimed == [(job.id, 1)]
    assert _messages(supervisor) == []
    assert _reread(supervisor, job.id).state == "starting"


def test_a_job_that_is_no_longer_queued_is_not_handed_back(supervisor: Supervisor) -> None:
    job = _job(supervisor, 4)
    with supervisor.sessions() as session:
        session.execute(update(Job).where(Job.id == job.id).values(state="cancelled"))
        session.commit()
    started = time.monotonic()
    supervisor.run(job.id)
    assert _messages(supervisor) == [] and time.monotonic() - started < 5
