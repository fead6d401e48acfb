"""Retention against Postgres and a local store: a job finished longer ago than
ACE3_LOG_RETENTION_DAYS has its log lines archived (gzipped JSONL, a job artifact) before its
rows go; ACE3_METRIC_RETENTION_DAYS deletes old metric points; recent jobs keep everything."""

from __future__ import annotations

import asyncio
import gzip
import json
from datetime import timedelta
from pathlib import Path

from sqlalchemy import delete, func, select, update

from ace3_control.db import (
    async_session_factory,
    make_async_engine,
    make_sync_engine,
    sync_session_factory,
)
from ace3_control.models import Job, JobArtifact, JobLog, JobMetric, JobState, Owner, utcnow
from ace3_control.settings import Settings
from ace3_control.storage import LocalArtifactStore
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
