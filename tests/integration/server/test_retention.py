"""Retention against Postgres and a local store: a job finished longer ago than
ACE3_LOG_RETENTION_DAYS has its log lines archived (gzipped JSONL, a job artifact) before its
rows go; ACE3_METRIC_RETENTION_DAYS deletes old metric points; recent jobs keep everything; a
line written while a pass runs is archived by a later pass, never deleted unarchived."""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from ace3_control.db import (
    async_session_factory,
    make_async_engine,
    make_sync_engine,
    sync_session_factory,
)
from ace3_control.models import Job, JobArtifact, JobLog, JobMetric, JobState, Owner, utcnow
from ace3_control.settings import Settings
from ace3_control.storage import LocalArtifactStore
from ace3_control.storage.base import KeyFor, Readable, StoredBlob
from ace3_server.retention import ARCHIVE_PATH, retain_once
from tests.conftest import insert_job


def test_old_logs_are_archived_then_deleted_and_old_metrics_pruned(
    database_url: str, tmp_path: Path
) -> None:
    engine = make_sync_engine(database_url)
    sessions = sync_session_factory(engine)
    now = utcnow()
    with sessions() as session:
        old, recent = (insert_job(session, state=JobState.SUCCEEDED) for _ in range(2))
        ids = [old.id, recent.id]
        for job_id, days in ((old.id, 10), (recent.id, 1)):
            session.execute(
                update(Job).where(Job.id == job_id).values(finished_at=now - timedelta(days=days))
            )
            session.add_all(
                JobLog(
                    job_id=job_id, attempt=1, rank=index % 2, stream="stdout", line=f"línea {index}"
                )
                for index in range(7)
            )
            session.add_all(
                JobMetric(job_id=job_id, step=step, name="train_loss", value=1.0 / step)
                for step in range(1, 4)
            )
        session.commit()
        lines = [
            (row.id, row.rank, row.line)
            for row in session.scalars(
                select(JobLog).where(JobLog.job_id == old.id).order_by(JobLog.id)
            )
        ]

    settings = Settings(
        database_url=database_url,
        data_dir=tmp_path,
        log_retention_days=7,
        metric_retention_days=5,
        retention_batch_jobs=1000,
    )
    store = LocalArtifactStore(tmp_path / "storage")

    async def retain() -> tuple[int, int]:
        async_engine = make_async_engine(database_url)
        try:
            return await retain_once(async_session_factory(async_engine), store, settings, now)
        finally:
            await async_engine.dispose()

    try:
        archived, pruned = asyncio.run(retain())
        assert archived >= 1 and pruned >= 1
        with sessions() as session:

            def count(model: type, job_id: str) -> int:
                return session.scalar(
                    select(func.count()).select_from(model).where(model.job_id == job_id)
                )

            assert (count(JobLog, old.id), count(JobMetric, old.id)) == (0, 0)
            assert (count(JobLog, recent.id), count(JobMetric, recent.id)) == (7, 3)
            artifact = session.scalar(select(JobArtifact).where(JobArtifact.job_id == old.id))
            assert artifact is not None and artifact.path == ARCHIVE_PATH
            assert session.get(Job, old.id).logs_archived_at is not None  # type: ignore[union-attr]
            assert (
                session.scalar(select(JobArtifact).where(JobArtifact.job_id == recent.id)) is None
            )
        with gzip.open(store.open(artifact.storage_key)) as archive:
            records = [json.loads(line) for line in archive]
        assert [(r["seq"], r["rank"], r["line"]) for r in records] == lines
        assert {r["attempt"] for r in records} == {1} and all(r["created_at"] for r in records)
        # A second pass has nothing left to do for the old job.
        asyncio.run(retain())
        with sessions() as session:
            assert (
                session.scalar(
                    select(func.count())
                    .select_from(JobArtifact)
                    .where(JobArtifact.job_id == old.id)
                )
                == 1
            )
    finally:
        with sessions() as session:
            owners = select(Job.owner_id).where(Job.id.in_(ids)).scalar_subquery()
            session.execute(delete(Owner).where(Owner.id.in_(owners)))
            session.commit()
        engine.dispose()


class _LateLineStore(LocalArtifactStore):
    """A local store that runs ``late`` (once) while the pass uploads the archive of job
    ``job_id``: after the pass read the job's lines, before it deletes them."""

    def __init__(self, root: Path, job_id: str, late: Callable[[], None]) -> None:
        super().__init__(root)
        self.job_id = job_id
        self.late: Callable[[], None] | None = late

    def put_hashed(self, source: Readable, key_for: KeyFor, **options: Any) -> StoredBlob:
        blob = super().put_hashed(source, key_for, **options)
        if self.late is not None and self.job_id in blob.key:
            late, self.late = self.late, None
            late()
        return blob


def _old_job_with_lines(session: Session, lines: int) -> str:
    job = insert_job(session, state=JobState.SUCCEEDED)
    session.execute(
        update(Job).where(Job.id == job.id).values(finished_at=utcnow() - timedelta(days=10))
    )
    session.add_all(
        JobLog(job_id=job.id, attempt=1, rank=0, stream="stdout", line=f"line {index}")
        for index in range(lines)
    )
    session.commit()
    return str(job.id)


def _late_line(job_id: str, text: str) -> JobLog:
    return JobLog(job_id=job_id, attempt=1, rank=0, stream="stderr", line=text)


def _archived_and_left(
    session: Session, store: LocalArtifactStore, job_id: str
) -> tuple[list[str], list[str]]:
    """(every archived line of the job, in the order of its archives, the lines left in rows)."""
    archived: list[str] = []
    for artifact in session.scalars(
        select(JobArtifact)
        .where(JobArtifact.job_id == job_id, JobArtifact.path.startswith("ace3-retention/"))
        .order_by(JobArtifact.created_at, JobArtifact.path)
    ):
        with gzip.open(store.open(artifact.storage_key)) as archive:
            archived += [json.loads(line)["line"] for line in archive]
    left = session.scalars(select(JobLog.line).where(JobLog.job_id == job_id)).all()
    return archived, list(left)


def _retain_until_done(
    database_url: str, store: LocalArtifactStore, settings: Settings, job_id: str
) -> None:
    """Retention passes until the job has no log rows left (at most three)."""

    async def passes() -> None:
        engine = make_async_engine(database_url)
        try:
            for _ in range(3):
                await retain_once(async_session_factory(engine), store, settings)
                async with async_session_factory(engine)() as session:
                    rows = await session.scalar(
                        select(func.count()).select_from(JobLog).where(JobLog.job_id == job_id)
                    )
                if not rows:
                    return
        finally:
            await engine.dispose()

    asyncio.run(passes())


def _settings(database_url: str, tmp_path: Path) -> Settings:
    return Settings(
        database_url=database_url,
        data_dir=tmp_path,
        log_retention_days=7,
        retention_batch_jobs=1000,
    )


def test_a_line_written_after_the_pass_read_the_logs_is_archived_by_a_later_pass(
    database_url: str, tmp_path: Path
) -> None:
    """The worker's late flush: a line committed while the pass uploads its archive (an id past
    the ones it read) is neither archived by that pass nor deleted unarchived by the next one."""
    engine = make_sync_engine(database_url)
    sessions = sync_session_factory(engine)
    with sessions() as session:
        job_id = _old_job_with_lines(session, 3)

    def late() -> None:
        with sessions() as session:
            session.add(_late_line(job_id, "late"))
            session.commit()

    store = _LateLineStore(tmp_path / "storage", job_id, late)
    try:
        _retain_until_done(database_url, store, _settings(database_url, tmp_path), job_id)
        with sessions() as session:
            archived, left = _archived_and_left(session, store, job_id)
            paths = session.scalars(
                select(JobArtifact.path).where(JobArtifact.job_id == job_id)
            ).all()
        assert (archived, left) == (["line 0", "line 1", "line 2", "late"], [])
        assert sorted(paths) == ["ace3-retention/logs-2.jsonl.gz", ARCHIVE_PATH]
    finally:
        _drop_owner_of(sessions, job_id)
        engine.dispose()


def test_a_line_committed_late_under_an_earlier_id_is_never_deleted_unarchived(
    database_url: str, tmp_path: Path
) -> None:
    """Ids are handed out before commit: a line inserted before the pass read the logs but
    committed after (another line after it committed first) has an id below the last one read.
    The pass must not delete it with the lines it archived."""
    engine = make_sync_engine(database_url)
    sessions = sync_session_factory(engine)
    with sessions() as session:
        job_id = _old_job_with_lines(session, 2)
    slow = sessions()
    slow.add(_late_line(job_id, "slow"))
    slow.flush()  # its id is taken, its row not committed
    with sessions() as session:
        session.add(_late_line(job_id, "fast"))
        session.commit()
    store = _LateLineStore(tmp_path / "storage", job_id, slow.commit)
    try:
        _retain_until_done(database_url, store, _settings(database_url, tmp_path), job_id)
        with sessions() as session:
            archived, left = _archived_and_left(session, store, job_id)
        assert left == []
        assert sorted(archived) == ["fast", "line 0", "line 1", "slow"], "each line once"
        kept = {path.name for path in (tmp_path / "storage" / "job-artifacts" / job_id).iterdir()}
        assert len(kept) == 1, "the rolled-back pass's archive is not left behind"
    finally:
        slow.close()
        _drop_owner_of(sessions, job_id)
        engine.dispose()


def _drop_owner_of(sessions: Any, job_id: str) -> None:
    with sessions() as session:
        owner = select(Job.owner_id).where(Job.id == job_id).scalar_subquery()
        session.execute(delete(Owner).where(Owner.id == owner))
        session.commit()
