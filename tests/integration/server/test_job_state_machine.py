"""The job state machine on real Postgres: claims are exclusive, stale attempts are fenced out,
the reconciler re-queues dead attempts and re-publishes lost messages, and an un-migrated
database is refused."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from ace3_control import job_transitions
from ace3_control.db import (
    async_session_factory,
    make_async_engine,
    make_sync_engine,
    sync_session_factory,
)
from ace3_control.models import Job, JobState, utcnow
from ace3_control.settings import Settings
from ace3_server.migrations_check import DatabaseNotMigratedError, ensure_migrated
from ace3_server.reconciler import reconcile_once
from tests.conftest import insert_job


@pytest.fixture()
def session(database_url: str) -> Iterator[Session]:
    engine = make_sync_engine(database_url)
    with sync_session_factory(engine)() as session:
        yield session
    engine.dispose()


def _job(session: Session, max_retries: int = 1) -> Job:
    return insert_job(session, max_retries=max_retries)


def test_only_one_worker_claims_a_job(session: Session) -> None:
    job = _job(session)
    first = session.execute(job_transitions.claim(job.id, "worker-a", 30)).first()
    second = session.execute(job_transitions.claim(job.id, "worker-b", 30)).first()
    session.commit()
    assert first is not None and first.attempt == 1
    assert second is None, "a duplicate message must not start a second attempt"


def test_a_stale_attempt_cannot_write(session: Session) -> None:
    job = _job(session)
    session.execute(job_transitions.claim(job.id, "worker-a", 30))
    session.execute(job_transitions.requeue_for_retry(job.id, 1, "worker lost"))
    session.execute(job_transitions.claim(job.id, "worker-b", 30))
    session.commit()
    stale = session.execute(job_transitions.finish(job.id, 1, JobState.SUCCEEDED, exit_code=0))
    assert stale.rowcount == 0
    assert session.execute(job_transitions.renew_lease(job.id, 1, 30)).first() is None
    current = session.execute(job_transitions.finish(job.id, 2, JobState.FAILED, exit_code=1))
    session.commit()
    assert current.rowcount == 1
    session.refresh(job)
    assert (job.state, job.attempt, job.exit_code) == ("failed", 2, 1)


def test_cancelling_a_queued_job_is_immediate_and_it_is_never_claimed(session: Session) -> None:
    job = _job(session)
    session.execute(job_transitions.cancel_queued(job.id))
    session.commit()
    assert session.execute(job_transitions.claim(job.id, "worker-a", 30)).first() is None
    session.refresh(job)
    assert job.state == "cancelled" and job.cancel_requested


class _RecordingPublisher:
    def __init__(self) -> None:
        self.published: list[str] = []

    def publish(self, job_id: str) -> None:
        self.published.append(job_id)


def test_reconciler_requeues_dead_attempts_then_fails_them(
    session: Session, database_url: str
) -> None:
    job = _job(session, max_retries=1)
    publisher = _RecordingPublisher()
    settings = Settings(database_url=database_url, republish_after_seconds=3600)

    async def reconcile() -> None:
        engine = make_async_engine(database_url)
        await reconcile_once(async_session_factory(engine), publisher, settings)  # type: ignore[arg-type]
        await engine.dispose()

    def expire_lease() -> None:
        session.execute(
            update(Job)
            .where(Job.id == job.id)
            .values(lease_expires_at=utcnow() - timedelta(seconds=1))
        )
        session.commit()

    session.execute(job_transitions.claim(job.id, "worker-a", 30))
    session.commit()
    expire_lease()
    asyncio.run(reconcile())
    session.refresh(job)
    assert job.state == "queued" and "lease expired" in (job.error or "")
    assert job.id in publisher.published

    session.execute(job_transitions.claim(job.id, "worker-b", 30))
    session.commit()
    expire_lease()
    asyncio.run(reconcile())
    session.refresh(job)
    assert job.state == "failed" and job.attempt == 2 and "no retries left" in (job.error or "")


def test_reconciler_republishes_queued_jobs_nobody_claimed(
    session: Session, database_url: str
) -> None:
    job = _job(session)
    session.execute(
        update(Job).where(Job.id == job.id).values(enqueued_at=utcnow() - timedelta(minutes=5))
    )
    session.commit()
    publisher = _RecordingPublisher()
    settings = Settings(database_url=database_url, republish_after_seconds=60)

    async def reconcile() -> None:
        engine = make_async_engine(database_url)
        await reconcile_once(async_session_factory(engine), publisher, settings)  # type: ignore[arg-type]
        await engine.dispose()

    asyncio.run(reconcile())
    assert job.id in publisher.published
    republished = session.scalar(select(Job.enqueued_at).where(Job.id == job.id))
    assert republished is not None and republished > utcnow() - timedelta(minutes=1)


def test_an_unmigrated_database_is_refused_with_the_command_that_fixes_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    with pytest.raises(DatabaseNotMigratedError, match="run `ace3 migrate`"):
        ensure_migrated(url)


def test_the_migrations_produce_exactly_the_models_schema(database_url: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from ace3_control.models import Base

    engine = make_sync_engine(database_url)
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []
    engine.dispose()


def test_the_server_command_refuses_an_unmigrated_database(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {
        **os.environ,
        "ACE3_DATA_DIR": str(tmp_path),
        "ACE3_DATABASE_URL": f"sqlite:///{tmp_path / 'new.db'}",
    }
    result = subprocess.run(
        [sys.executable, "-m", "ace3.cli", "server", "--port", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "run `ace3 migrate`" in result.stderr


def test_out_of_memory_retries_halve_the_micro_batch_without_using_the_retry_budget(
    session: Session,
) -> None:
    job = _job(session, max_retries=1)
    for attempt in (1, 2, 3):  # three attempts run out of memory: each is re-queued
        session.execute(job_transitions.claim(job.id, "worker-a", 30))
        requeued = session.execute(
            job_transitions.requeue_with_half_the_micro_batch(job.id, attempt, "oom", 3)
        )
        assert requeued.rowcount == 1
    session.execute(job_transitions.claim(job.id, "worker-a", 30))
    # The retry budget (1) is still whole: attempt 4 dies with its worker and is retried once.
    assert session.execute(job_transitions.requeue_for_retry(job.id, 4, "lost")).rowcount == 1
    session.execute(job_transitions.claim(job.id, "worker-a", 30))
    assert session.execute(job_transitions.requeue_for_retry(job.id, 5, "lost")).rowcount == 0
    session.commit()
    session.refresh(job)
    assert (job.attempt, job.micro_batch_halvings) == (5, 3)
    stale = job_transitions.requeue_with_half_the_micro_batch(job.id, 4, "oom", 10)
    assert session.execute(stale).rowcount == 0, "fenced by the attempt"
    session.execute(update(Job).where(Job.id == job.id).values(state="running", attempt=6))
    capped = job_transitions.requeue_with_half_the_micro_batch(job.id, 6, "oom", 3)
    assert session.execute(capped).rowcount == 0, "no more halvings than the micro-batch allows"


def test_preemptions_requeue_without_using_the_retry_budget(
    session: Session, database_url: str
) -> None:
    job = _job(session, max_retries=1)
    for attempt in (1, 2):  # two drained workers: each attempt is re-queued as a preemption
        session.execute(job_transitions.claim(job.id, "worker-a", 30))
        requeued = session.execute(
            job_transitions.requeue_after_preemption(job.id, attempt, "drained", 10)
        )
        assert requeued.rowcount == 1
    session.execute(job_transitions.claim(job.id, "worker-a", 30))
    # The retry budget (1) is still whole: attempt 3 dies with its worker and is retried once,
    # by the worker itself or by the reconciler (the same budget).
    assert session.execute(job_transitions.requeue_for_retry(job.id, 3, "lost")).rowcount == 1
    session.execute(job_transitions.claim(job.id, "worker-a", 30))
    session.execute(
        update(Job).where(Job.id == job.id).values(lease_expires_at=utcnow() - timedelta(seconds=1))
    )
    session.commit()
    engine = make_async_engine(database_url)
    settings = Settings(database_url=database_url, republish_after_seconds=3600)
    asyncio.run(
        reconcile_once(async_session_factory(engine), _RecordingPublisher(), settings)  # type: ignore[arg-type]
    )
    asyncio.run(engine.dispose())
    session.refresh(job)
    assert (job.state, job.attempt, job.preemptions) == ("failed", 4, 2)
    assert "no retries left" in (job.error or "")
    session.execute(update(Job).where(Job.id == job.id).values(state="running", attempt=5))
    capped = job_transitions.requeue_after_preemption(job.id, 5, "drained", 2)
    assert session.execute(capped).rowcount == 0, "no more than ACE3_MAX_PREEMPTIONS"
    cancelled = job_transitions.requeue_after_preemption(job.id, 5, "drained", 10)
    session.execute(update(Job).where(Job.id == job.id).values(cancel_requested=True))
    assert session.execute(cancelled).rowcount == 0, "a cancel asked meanwhile wins"
    session.rollback()
