"""Retention of finished jobs' rows: ``ACE3_LOG_RETENTION_DAYS`` and
``ACE3_METRIC_RETENTION_DAYS`` (unset: keep forever).

A loop of the API (every ``ACE3_RETENTION_INTERVAL_SECONDS``) takes at most
``ACE3_RETENTION_BATCH_JOBS`` jobs that finished before each cutoff, oldest first:

- logs: the job's log lines are written to the artifact store as a gzipped JSONL file (one
  object per line: seq, attempt, rank, stream, line, created_at) under the job's artifact prefix,
  recorded as the job's artifact ``ace3-retention/logs.jsonl.gz`` (the owner downloads it with
  ``GET /v1/jobs/{id}/artifacts/ace3-retention/logs.jsonl.gz``), and only then are the rows
  deleted;
- metrics: the job's metric points are deleted (``final_metrics`` on the job stays).

No line is deleted that is not in an archive. The rows archived are deleted in the transaction
that records the archive and marks ``jobs.logs_archived_at``, and only when the delete removes
exactly as many rows as were archived: a pass cut short leaves every row (and at most an
archive no row names), and a line committed while the pass ran under an id it had read past
(ids are handed out before commit) rolls the pass back. A line written after the archive was
read (a worker's late flush) stays, and a later pass archives it into a further file
(``ace3-retention/logs-2.jsonl.gz``...). Several API replicas may run it: the second to delete
the same rows finds none left and rolls back; a second archive of the same bytes is the same
stored key. ``jobs.metrics_pruned_at`` marks the jobs whose metrics are done.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import tempfile
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import delete, exists, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from starlette.concurrency import run_in_threadpool

from ace3_control.db import rows_changed
from ace3_control.models import TERMINAL_STATES, Job, JobArtifact, JobLog, JobMetric, utcnow
from ace3_control.settings import Settings
from ace3_control.storage import ArtifactStore

logger = logging.getLogger(__name__)

ARCHIVE_PATH = "ace3-retention/logs.jsonl.gz"
PAGE_ROWS = 5000  # log rows read, or rows deleted, per statement


def archive_key(job_id: str, sha256: str) -> str:
    """Beside the job's synced artifacts, by content."""
    return f"job-artifacts/{job_id}/{sha256}"


def _due(cutoff: datetime, marked: Any, rows: Any) -> Any:
    """Finished before ``cutoff``, and not done yet (unmarked, or rows left by a cut pass)."""
    return (
        Job.state.in_(TERMINAL_STATES),
        Job.finished_at < cutoff,
        or_(marked.is_(None), exists().where(rows.job_id == Job.id)),
    )


async def _due_jobs(
    session: AsyncSession, cutoff: datetime, marked: Any, rows: Any, limit: int
) -> list[str]:
    stmt = (
        select(Job.id)
        .where(*_due(cutoff, marked, rows))
        .order_by(Job.finished_at, Job.id)
        .limit(limit)
    )
    return list((await session.scalars(stmt)).all())


async def _delete_rows(session: AsyncSession, model: Any, job_id: str, through: int) -> None:
    """Delete the job's rows with ids <= ``through``, ``PAGE_ROWS`` a statement and commit."""
    while True:
        chunk = select(model.id).where(model.job_id == job_id, model.id <= through).limit(PAGE_ROWS)
        result = await session.execute(delete(model).where(model.id.in_(chunk)))
        await session.commit()
        if rows_changed(result) < PAGE_ROWS:
            return


def _line(row: JobLog) -> bytes:
    record = {
        "seq": row.id,
        "attempt": row.attempt,
        "rank": row.rank,
        "stream": row.stream,
        "line": row.line,
        "created_at": row.created_at.isoformat(),
    }
    return (json.dumps(record, ensure_ascii=False) + "\n").encode()


async def _write_archive(session: AsyncSession, job_id: str, target: Path) -> tuple[int, int]:
    """The job's log lines into ``target`` (gzipped JSONL): (lines, the last seq)."""
    count, last = 0, 0
    with gzip.open(target, "wb") as archive:
        while True:
            rows = (
                await session.scalars(
                    select(JobLog)
                    .where(JobLog.job_id == job_id, JobLog.id > last)
                    .order_by(JobLog.id)
                    .limit(PAGE_ROWS)
                )
            ).all()
            if not rows:
                return count, last
            await run_in_threadpool(archive.write, b"".join(_line(row) for row in rows))
            count, last = count + len(rows), rows[-1].id


async def _free_path(session: AsyncSession, job_id: str) -> str:
    """``ace3-retention/logs.jsonl.gz``, or with a number when the job wrote one of its own."""
    taken = set(
        (
            await session.scalars(
                select(JobArtifact.path).where(
                    JobArtifact.job_id == job_id, JobArtifact.path.startswith("ace3-retention/")
                )
            )
        ).all()
    )
    path, number = ARCHIVE_PATH, 1
    while path in taken:
        number += 1
        path = f"ace3-retention/logs-{number}.jsonl.gz"
    return path


async def _drop_unrecorded(session: AsyncSession, store: ArtifactStore, key: str) -> None:
    """Delete an archive the pass stored but did not record, unless a row names its key (the
    same bytes archived by another replica)."""
    named = await session.scalar(select(exists().where(JobArtifact.storage_key == key)))
    if not named:
        await run_in_threadpool(store.delete, key)


async def archive_logs(
    session: AsyncSession, store: ArtifactStore, job_id: str, now: datetime
) -> int:
    """Archive the finished job's log lines, then delete exactly those; the lines archived
    (0 when the pass was rolled back: it runs again next time)."""
    blob = None
    with tempfile.TemporaryDirectory(dir=store.staging_dir()) as folder:
        target = Path(folder) / "logs.jsonl.gz"
        count, through = await _write_archive(session, job_id, target)
        await session.rollback()  # (end the reads' transaction)
        if count:
            with target.open("rb") as source:
                blob = await run_in_threadpool(
                    store.put_hashed, source, lambda sha: archive_key(job_id, sha)
                )
    # One transaction: the rows go with the archive's record and the mark, or nothing does.
    deleted = await session.execute(
        delete(JobLog).where(JobLog.job_id == job_id, JobLog.id <= through)
    )
    if rows_changed(deleted) != count:
        await session.rollback()
        logger.info(
            "job %s: %d log lines archived but %d to delete (a line committed meanwhile, or "
            "another replica archived them); trying again next pass",
            job_id,
            count,
            rows_changed(deleted),
        )
        if blob is not None:
            await _drop_unrecorded(session, store, blob.key)
            await session.commit()
        return 0
    await session.execute(
        update(Job)
        .where(Job.id == job_id)
        .values(logs_archived_at=func.coalesce(Job.logs_archived_at, now))
    )
    if blob is not None:
        session.add(
            JobArtifact(
                job_id=job_id,
                path=await _free_path(session, job_id),
                attempt=0,
                version=1,
                size_bytes=blob.size_bytes,
                sha256=blob.sha256,
                storage_key=blob.key,
                created_at=now,
                updated_at=now,
            )
        )
    await session.commit()
    return count


async def prune_metrics(session: AsyncSession, job_id: str, now: datetime) -> None:
    await session.execute(
        update(Job)
        .where(Job.id == job_id, Job.metrics_pruned_at.is_(None))
        .values(metrics_pruned_at=now)
    )
    await session.commit()
    through = await session.scalar(select(func.max(JobMetric.id)).where(JobMetric.job_id == job_id))
    await _delete_rows(session, JobMetric, job_id, int(through or 0))


async def retain_once(
    session_factory: async_sessionmaker[AsyncSession],
    store: ArtifactStore,
    settings: Settings,
    now: datetime | None = None,
) -> tuple[int, int]:
    """One bounded pass: (jobs whose logs were archived, jobs whose metrics were pruned)."""
    now = now or utcnow()
    batch = settings.retention_batch_jobs
    logs = metrics = 0
    async with session_factory() as session:
        if settings.log_retention_days is not None:
            cutoff = now - timedelta(days=settings.log_retention_days)
            for job_id in await _due_jobs(session, cutoff, Job.logs_archived_at, JobLog, batch):
                lines = await archive_logs(session, store, job_id, now)
                logs += 1
                logger.info(
                    "job %s: %d log lines archived to the store, rows deleted", job_id, lines
                )
        if settings.metric_retention_days is not None:
            cutoff = now - timedelta(days=settings.metric_retention_days)
            for job_id in await _due_jobs(session, cutoff, Job.metrics_pruned_at, JobMetric, batch):
                await prune_metrics(session, job_id, now)
                metrics += 1
    return logs, metrics


async def run_retention(
    session_factory: async_sessionmaker[AsyncSession],
    store: ArtifactStore,
    settings: Settings,
) -> None:
    while True:
        try:
            await retain_once(session_factory, store, settings)
        except Exception:
            logger.exception("retention pass failed; trying again next interval")
        await asyncio.sleep(settings.retention_interval_seconds)
