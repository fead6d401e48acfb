"""The worker registry on the embedded database (SQLite): a worker's row from registration to
shutdown, the staleness window, admission against the live workers, and the reconciler failing
a job no live worker can run once it waited long enough."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session

import ace3
from ace3_control.capacity import Capacity
from ace3_control.db import (
    async_session_factory,
    make_async_engine,
    make_sync_engine,
    sync_session_factory,
)
from ace3_control.models import Job, Worker, utcnow
from ace3_control.settings import Settings, usable_cores
from ace3_control.worker_registry import FORGET_AFTER, is_live, live_workers
from ace3_server.migrations_check import upgrade
from ace3_server.reconciler import reconcile_once
from ace3_server.services.admission import capacity_problems
from ace3_worker.registration import Registration
from tests.conftest import insert_job


@pytest.fixture()
def settings(tmp_path: Path) -> Settings:
    settings = Settings(data_dir=tmp_path, heartbeat_seconds=1.0, queue_name="q")
    upgrade(settings.resolved_database_url)
    return settings


@pytest.fixture()
def session(settings: Settings) -> Iterator[Session]:
    engine = make_sync_engine(settings.resolved_database_url)
    with sync_session_factory(engine)() as session:
        yield session
    engine.dispose()


def _worker(session: Session, kind: str = "cpu", count: int = 2, **fields: Any) -> Worker:
    now = utcnow()
    values: dict[str, Any] = {"hostname": "h", "pid": 1, "device_kind": kind,
                              "device_count": count, "slots": 1, "queue": "q",
                              "heartbeat_seconds": 1.0, "started_at": now, "last_seen_at": now,
                              **fields}  # fmt: skip
    worker = Worker(**values)
    session.add(worker)
    session.commit()
    return worker


def _run(settings: Settings, action: Any) -> Any:
    async def go() -> Any:
        engine = make_async_engine(settings.resolved_database_url)
        try:
            return await action(async_session_factory(engine))
        finally:
            await engine.dispose()

    return asyncio.run(go())


def _live(settings: Settings) -> list[Worker]:
    async def action(factory: Any) -> list[Worker]:
        async with factory() as s:
            return await live_workers(s, settings)

    return _run(settings, action)


# -- settings ---------------------------------------------------------------------------------
def test_cpu_processes_default_to_the_usable_cores_and_can_be_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings().resolved_worker_cpu_processes == max(1, usable_cores())
    monkeypatch.setenv("ACE3_WORKER_CPU_PROCESSES", "8")
    assert Settings().resolved_worker_cpu_processes == 8
    monkeypatch.setenv("ACE3_WORKER_CPU_PROCESSES", "0")
    with pytest.raises(ValueError, match="worker_cpu_processes"):
        Settings()


def test_the_staleness_window_is_three_heartbeats_unless_set() -> None:
    assert Settings(heartbeat_seconds=5).resolved_worker_stale_after_seconds == 15
    assert Settings(worker_stale_after_seconds=40).resolved_worker_stale_after_seconds == 40


# -- liveness ---------------------------------------------------------------------------------
def test_a_worker_is_gone_once_silent_for_the_staleness_window(settings: Settings) -> None:
    now = utcnow()
    worker = Worker(heartbeat_seconds=1.0, last_seen_at=now - timedelta(seconds=2.9))
    assert is_live(worker, settings, now)
    worker.last_seen_at = now - timedelta(seconds=3.1)
    assert not is_live(worker, settings, now)


def test_a_worker_with_a_slower_heartbeat_gets_three_of_its_own(settings: Settings) -> None:
    now = utcnow()
    slow = Worker(heartbeat_seconds=10.0, last_seen_at=now - timedelta(seconds=25))
    assert is_live(slow, settings, now)
    slow.last_seen_at = now - timedelta(seconds=31)
    assert not is_live(slow, settings, now)


def test_live_workers_are_the_recent_ones_of_this_queue(
    settings: Settings, session: Session
) -> None:
    live = _worker(session, count=4)
    _worker(session, last_seen_at=utcnow() - timedelta(seconds=10))
    _worker(session, queue="another-queue")
    assert [w.id for w in _live(settings)] == [live.id]


# -- registration -----------------------------------------------------------------------------
def test_a_worker_registers_heartbeats_and_deregisters(
    settings: Settings, session: Session
) -> None:
    registration = Registration(settings, Capacity("cpu", 3))
    registration.register()
    row = session.get(Worker, registration.worker_id)
    assert row is not None
    assert (row.device_kind, row.device_count, row.slots, row.queue) == ("cpu", 3, 1, "q")
    first_seen = row.last_seen_at
    session.execute(
        update(Worker).values(last_seen_at=utcnow() - timedelta(seconds=30))
    )  # silent for a while: gone
    session.commit()
    assert _live(settings) == []
    registration.heartbeat()
    session.expire_all()
    assert [w.id for w in _live(settings)] == [registration.worker_id]
    assert session.get(Worker, registration.worker_id).last_seen_at >= first_seen  # type: ignore[union-attr]
    registration.stop()
    session.expire_all()
    assert session.get(Worker, registration.worker_id) is None
    registration.stop()  # idempotent


def test_a_forgotten_worker_registers_again_on_its_next_heartbeat(
    settings: Settings, session: Session
) -> None:
    registration = Registration(settings, Capacity("cpu", 2))
    registration.register()
    session.execute(
        update(Worker).values(last_seen_at=utcnow() - FORGET_AFTER - timedelta(seconds=1))
    )
    session.commit()
    _run(settings, lambda factory: reconcile_once(factory, _NoPublisher(), settings))
    assert session.scalars(select(Worker)).all() == []
    registration.heartbeat()
    started = registration.started_at
    session.expire_all()
    row = session.get(Worker, registration.worker_id)
    assert row is not None and row.started_at == started
    registration.stop()


def test_the_heartbeat_thread_keeps_the_row_fresh(settings: Settings, session: Session) -> None:
    fast = settings.model_copy(update={"heartbeat_seconds": 0.05})
    registration = Registration(fast, Capacity("cpu", 1))
    registration.register()
    registration.start_heartbeats()
    try:
        session.execute(update(Worker).values(last_seen_at=utcnow() - timedelta(seconds=60)))
        session.commit()
        deadline = utcnow() + timedelta(seconds=5)
        while utcnow() < deadline and not _live(fast):
            asyncio.run(asyncio.sleep(0.05))
        assert [w.id for w in _live(fast)] == [registration.worker_id]
    finally:
        registration.stop()


# -- admission --------------------------------------------------------------------------------
def _admission(settings: Settings, config: ace3.TrainingConfig, **kw: Any) -> list[dict]:
    async def action(factory: Any) -> list[dict]:
        async with factory() as s:
            return await capacity_problems(s, settings, config, ["body", "config"], **kw)

    return _run(settings, action)


def test_admission_against_the_live_workers(settings: Settings, session: Session) -> None:
    big = ace3.TrainingConfig(num_gpus=4, batch_size=32)
    nccl = ace3.TrainingConfig(num_gpus=1, backend="nccl")
    assert _admission(settings, big) == [], "no worker registered: accepted, it waits"
    _worker(session, count=2)
    [problem] = _admission(settings, big)
    assert problem["loc"] == ["body", "config", "num_gpus"]
    assert "the largest live worker has 2 CPU processes" in problem["msg"]
    [problem] = _admission(settings, nccl)
    assert problem["loc"] == ["body", "config", "backend"]
    assert _admission(settings, big, searched={"num_gpus"}) == []
    _worker(session, kind="cuda", count=4)
    assert _admission(settings, big) == [] and _admission(settings, nccl) == []


# -- the reconciler ---------------------------------------------------------------------------
class _NoPublisher:
    def __init__(self) -> None:
        self.published: list[str] = []

    def publish(self, job_id: str) -> None:
        self.published.append(job_id)


def _queued_job(session: Session, processes: int, waited: float, backend: str = "auto") -> Job:
    job = insert_job(
        session,
        num_processes=processes,
        config={"num_gpus": processes, "backend": backend},
        queued_at=utcnow() - timedelta(seconds=waited),
    )
    return job


def test_the_reconciler_fails_a_job_no_live_worker_can_run_after_the_wait(
    settings: Settings, session: Session
) -> None:
    settings = settings.model_copy(update={"unschedulable_after_seconds": 60})
    too_big = _queued_job(session, 4, waited=120)
    nccl = _queued_job(session, 1, waited=120, backend="nccl")
    fits = _queued_job(session, 2, waited=120)
    recent = _queued_job(session, 4, waited=10)

    def reconcile() -> None:
        _run(settings, lambda factory: reconcile_once(factory, _NoPublisher(), settings))
        session.expire_all()

    reconcile()
    assert {j.state for j in (too_big, nccl, fits, recent)} == {"queued"}, "no live worker: wait"
    _worker(session, count=2, last_seen_at=utcnow() - timedelta(seconds=30))
    reconcile()
    assert too_big.state == "queued", "a dead worker does not count"
    _worker(session, count=2)
    reconcile()
    assert (too_big.state, nccl.state, fits.state, recent.state) == (
        "failed",
        "failed",
        "queued",
        "queued",
    )
    assert too_big.error is not None and too_big.attempt == 0
    assert too_big.error.startswith("no live worker can run this job, after it waited 60 s")
    assert "the largest live worker has 2 CPU processes" in too_big.error
    assert nccl.error is not None and "backend='nccl' needs a CUDA worker" in nccl.error
    assert too_big.finished_at is not None
