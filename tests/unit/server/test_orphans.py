"""Which jobs count as orphaned (their worker is dead) and are re-queued without waiting for
their lease: a worker row that stopped changing for the staleness window, a registration that is
gone; never a live worker's job, whose own heartbeat may be late. The decision on a fake clock,
the reconciler on the embedded database, and the bound on the recovery time the defaults give."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session

from ace3_control import job_transitions
from ace3_control.db import (
    async_session_factory,
    make_async_engine,
    make_sync_engine,
    sync_session_factory,
)
from ace3_control.models import Job, JobState, Worker, new_id, utcnow
from ace3_control.orphans import HeartbeatWatch, WorkerRow, is_registry_id, orphaned
from ace3_control.settings import Settings
from ace3_server.migrations_check import upgrade
from ace3_server.reconciler import reconcile_once
from tests.conftest import insert_job

EPOCH = datetime(2030, 1, 1, tzinfo=UTC)


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _settings(**fields: Any) -> Settings:
    return Settings(heartbeat_seconds=1.0, reconcile_interval_seconds=1.0, **fields)


def _beat(seconds: float) -> WorkerRow:
    return WorkerRow(utcnow().replace(microsecond=0) + timedelta(seconds=seconds), 1.0)


def test_registry_ids_are_told_from_process_names() -> None:
    assert is_registry_id(new_id())
    assert not is_registry_id("host:1234") and not is_registry_id(None)


def test_a_worker_whose_row_stopped_changing_is_dead_after_the_window() -> None:
    clock, worker = Clock(), new_id()
    watch = HeartbeatWatch(_settings(), clock)
    row = _beat(0)
    for _ in range(3):  # passes 1 s apart: silent 0, 1, 2 s: not yet (window 3 s)
        watch.observe({worker: row})
        assert orphaned({"job": [worker]}, {worker: row}, watch) == []
        clock.now += 1
    watch.observe({worker: row})
    [orphan] = orphaned({"job": [worker]}, {worker: row}, watch)
    assert (orphan.job_id, orphan.worker_id) == ("job", worker)
    assert "no heartbeat for 3 s" in orphan.reason


def test_a_live_worker_s_job_is_never_orphaned_however_late_its_own_heartbeat() -> None:
    clock, worker = Clock(), new_id()
    watch = HeartbeatWatch(_settings(), clock)
    for second in range(60):  # the row changes every pass; the job's heartbeat is not read
        row = _beat(second)
        watch.observe({worker: row})
        assert orphaned({"job": [worker]}, {worker: row}, watch) == []
        clock.now += 1


def test_a_missing_registration_is_dead_after_the_window_unless_it_comes_back() -> None:
    clock, gone, back = Clock(), new_id(), new_id()
    watch = HeartbeatWatch(_settings(), clock)
    missing = WorkerRow(None)
    rows = {gone: missing, back: missing}
    holders = {"j1": [gone], "j2": [back]}
    for _ in range(2):
        watch.observe(rows)
        assert orphaned(holders, rows, watch) == []
        clock.now += 1
    rows[back] = _beat(0)  # (its first heartbeat registered it again)
    watch.observe(rows)
    clock.now += 1
    watch.observe(rows)
    [orphan] = orphaned(holders, rows, watch)
    assert orphan.job_id == "j1" and "registration is gone" in orphan.reason


def test_a_process_name_without_a_registration_is_left_to_the_lease() -> None:
    clock = Clock()
    watch = HeartbeatWatch(_settings(), clock)
    for _ in range(10):
        watch.observe({})
        assert orphaned({"job": ["host:1234"]}, {}, watch) == []
        clock.now += 1


def test_a_worker_with_a_slower_heartbeat_gets_three_of_its_own() -> None:
    clock, worker = Clock(), new_id()
    watch = HeartbeatWatch(_settings(), clock)
    row = WorkerRow(utcnow(), 5.0)
    for _ in range(15):
        watch.observe({worker: row})
        assert orphaned({"job": [worker]}, {worker: row}, watch) == []
        clock.now += 1
    watch.observe({worker: row})
    assert len(orphaned({"job": [worker]}, {worker: row}, watch)) == 1


def test_a_gap_between_passes_or_a_failed_pass_starts_the_watch_afresh() -> None:
    """A database that stalled (or was down) held the heartbeats back too: no worker is judged
    on a silence the database caused."""
    clock, worker = Clock(), new_id()
    watch = HeartbeatWatch(_settings(), clock)
    row = _beat(0)
    watch.observe({worker: row})
    clock.now += 10  # (more than interval + heartbeat: the pass was held up)
    watch.observe({worker: row})
    assert orphaned({"job": [worker]}, {worker: row}, watch) == []
    clock.now += 2
    watch.reset()
    watch.observe({worker: row})
    assert watch.silent_for(worker) == 0


def test_a_dead_node_orphans_its_gang_while_the_leader_lives() -> None:
    clock, leader, node = Clock(), new_id(), new_id()
    watch = HeartbeatWatch(_settings(), clock)
    node_row = _beat(0)
    for second in range(4):
        rows = {leader: _beat(second), node: node_row}
        watch.observe(rows)
        clock.now += 1
    clock.now -= 1
    [orphan] = orphaned({"gang": [leader, node]}, rows, watch)
    assert orphan.worker_id == node


def _row_at(now: float, last_beat: float, heartbeat: float) -> WorkerRow:
    """The row as read at ``now`` of a worker that beats every ``heartbeat`` until
    ``last_beat``: its newest beat not after ``now``."""
    beat = (
        last_beat
        if now >= last_beat
        else last_beat - math.ceil((last_beat - now) / heartbeat) * heartbeat
    )
    return WorkerRow(EPOCH + timedelta(seconds=beat), heartbeat)


def test_the_defaults_re_queue_a_dead_worker_s_job_within_10_seconds() -> None:
    """Worst case over the phases of the last heartbeat and of the reconciler's passes, with the
    default heartbeat (2 s), staleness window (3 heartbeats) and reconcile interval (2 s): the
    re-queue comes at most window + 2 intervals (10 s) after the kill. (The e2e test measures the rest:
    publish, claim and start.)"""
    settings = Settings()
    assert (settings.heartbeat_seconds, settings.reconcile_interval_seconds) == (2.0, 2.0)
    assert settings.resolved_worker_stale_after_seconds == 6.0
    worker, worst = new_id(), 0.0
    steps = 20
    for beat_phase in range(steps):
        for pass_phase in range(steps):
            clock = Clock()
            clock.now = 0.0
            watch = HeartbeatWatch(settings, clock)
            kill = 10.0
            last_beat = kill - beat_phase * settings.heartbeat_seconds / steps
            now = pass_phase * settings.reconcile_interval_seconds / steps
            while True:
                clock.now = now
                watch.observe({worker: _row_at(now, last_beat, settings.heartbeat_seconds)})
                rows = {worker: _row_at(now, last_beat, settings.heartbeat_seconds)}
                if orphaned({"job": [worker]}, rows, watch):
                    break
                now += settings.reconcile_interval_seconds
            assert now > kill, "a live worker was judged dead"
            worst = max(worst, now - kill)
    print(f"defaults: a dead worker's job is re-queued at most {worst:.2f} s after the kill")
    # window + one interval, and one more for a pass that lands a hair before the window ends
    bound = settings.resolved_worker_stale_after_seconds + 2 * settings.reconcile_interval_seconds
    assert worst <= bound == 10.0


# -- the reconciler on the embedded database ----------------------------------------------------
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


class _Publisher:
    def __init__(self) -> None:
        self.published: list[str] = []

    def publish(self, job_id: str, countdown: float | None = None) -> None:
        self.published.append(job_id)


def _pass(settings: Settings, publisher: _Publisher, watch: HeartbeatWatch) -> None:
    async def go() -> None:
        engine = make_async_engine(settings.resolved_database_url)
        try:
            await reconcile_once(async_session_factory(engine), publisher, settings, watch)  # type: ignore[arg-type]
        finally:
            await engine.dispose()

    asyncio.run(go())


def _running_job(session: Session, worker_id: str) -> Job:
    """A running attempt whose lease is good for an hour and whose own heartbeat is an hour
    late: only the worker's row can tell."""
    job = insert_job(session, max_retries=2)
    claimed = session.execute(job_transitions.claim(job.id, worker_id, 3600)).first()
    assert claimed is not None
    session.execute(
        update(Job)
        .where(Job.id == job.id)
        .values(state=JobState.RUNNING, heartbeat_at=utcnow() - timedelta(hours=1))
    )
    session.commit()
    return job


def _worker(session: Session) -> Worker:
    now = utcnow()
    worker = Worker(hostname="h", pid=1, device_kind="cpu", device_count=2, slots=1, queue="q",
                    heartbeat_seconds=1.0, started_at=now, last_seen_at=now)  # fmt: skip
    session.add(worker)
    session.commit()
    return worker


def test_the_reconciler_requeues_a_dead_worker_s_job_before_its_lease_and_spares_a_live_one(
    settings: Settings, session: Session
) -> None:
    dead, alive = _worker(session), _worker(session)
    dead_job, alive_job = _running_job(session, dead.id), _running_job(session, alive.id)
    gone_job = _running_job(session, new_id())  # (a registration deleted meanwhile)
    clock, publisher = Clock(), _Publisher()
    watch = HeartbeatWatch(settings.model_copy(update={"reconcile_interval_seconds": 1.0}), clock)
    for _ in range(3):  # passes 1 s apart (silent 0, 1, 2 s); the live worker heartbeats
        _pass(settings, publisher, watch)
        session.execute(update(Worker).where(Worker.id == alive.id).values(last_seen_at=utcnow()))
        session.commit()
        clock.now += 1
    assert publisher.published == []
    _pass(settings, publisher, watch)
    assert sorted(publisher.published) == sorted([dead_job.id, gone_job.id])
    session.expire_all()
    requeued = session.get(Job, dead_job.id)
    assert requeued is not None and requeued.state == JobState.QUEUED
    assert requeued.error is not None and f"worker {dead.id} is dead" in requeued.error
    kept = session.get(Job, alive_job.id)
    assert kept is not None and kept.state == JobState.RUNNING and kept.attempt == 1
    # The slow worker's next heartbeat finds the job no longer its attempt's: it stops.
    renewed = session.execute(job_transitions.renew_lease(dead_job.id, 1, 60)).first()
    assert renewed is None
