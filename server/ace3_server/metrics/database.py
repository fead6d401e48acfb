"""Cluster-wide metrics read from the database at scrape time (the source of truth: the workers
run in other processes, and several API processes may serve ``/metrics``).

One short session per read (at most one per ``ACE3_METRICS_CACHE_SECONDS``: see
:mod:`ace3_server.metrics.cache`), a few aggregate queries, bounded by a statement timeout
(Postgres) and an overall deadline: jobs by state (``ix_jobs_state_lease``), the queue-wait
and time-to-first-metric histograms (one aggregate query each over the jobs that started; the
first metric is found through ``uq_job_metrics_job_step_name``), the ingested metric points and
log lines (the newest row id: an O(1) primary-key lookup, counting rows ever stored), and the
live workers with their slots. No label carries an owner, a job id or a job name.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, case, func, literal, select, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import InstrumentedAttribute

from ace3_control.models import (
    ACTIVE_STATES,
    Job,
    JobLog,
    JobMetric,
    JobNode,
    JobState,
    NodeState,
)
from ace3_control.settings import Settings
from ace3_control.worker_registry import live_workers

logger = logging.getLogger(__name__)

QUEUE_WAIT_BUCKETS = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 14400.0)
FIRST_METRIC_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
STATEMENT_TIMEOUT_MS = 2000
SCRAPE_DEADLINE_SECONDS = 5.0


@dataclass(frozen=True)
class HistogramCounts:
    """Cumulative bucket counts (one per upper bound, then +Inf = count) and the sum."""

    bounds: tuple[float, ...]
    cumulative: tuple[int, ...]
    count: int
    total: float


@dataclass(frozen=True)
class DatabaseSnapshot:
    jobs_by_state: dict[str, int]
    queue_wait: HistogramCounts | None
    first_metric: HistogramCounts | None
    metric_points: int
    log_lines: int
    live_workers: int
    worker_slots: int
    worker_devices: int
    busy_slots: int

    @property
    def free_slots(self) -> int:
        return max(0, self.worker_slots - self.busy_slots)


def seconds_between(
    later: ColumnElement[Any] | InstrumentedAttribute[Any],
    earlier: ColumnElement[Any] | InstrumentedAttribute[Any],
    dialect: str,
) -> ColumnElement[Any]:
    """``later - earlier`` in seconds, in this dialect's SQL."""
    if dialect == "sqlite":
        return (func.julianday(later) - func.julianday(earlier)) * 86400.0
    return func.extract("epoch", later - earlier)


def _histogram_row(seconds: ColumnElement[Any], bounds: Sequence[float]) -> list[Any]:
    columns = [func.sum(case((seconds <= bound, 1), else_=0)) for bound in bounds]
    return [*columns, func.count(seconds), func.sum(seconds)]


async def _histogram(
    session: AsyncSession,
    seconds: ColumnElement[Any],
    where: Sequence[ColumnElement[bool]],
    bounds: Sequence[float],
) -> HistogramCounts | None:
    """None when the query failed or ran past the statement timeout (a huge jobs table): the
    scrape goes on without this histogram (its own savepoint keeps the transaction usable)."""
    # OFFSET 0 keeps Postgres from inlining the subquery, which would evaluate ``seconds`` (a
    # correlated subquery for the first metric) once per bucket instead of once per job.
    inner = select(seconds.label("seconds")).where(*where).offset(0).subquery()
    try:
        async with session.begin_nested():
            row = (await session.execute(select(*_histogram_row(inner.c.seconds, bounds)))).one()
    except SQLAlchemyError:
        logger.warning("/metrics: a histogram query failed; it is left out", exc_info=True)
        return None
    *buckets, count, total = row
    return HistogramCounts(
        bounds=tuple(bounds),
        cumulative=tuple(int(value or 0) for value in buckets),
        count=int(count or 0),
        total=float(total or 0.0),
    )


async def _read(session: AsyncSession, settings: Settings) -> DatabaseSnapshot:
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        await session.execute(text(f"SET LOCAL statement_timeout = {STATEMENT_TIMEOUT_MS}"))
    states = {state.value: 0 for state in JobState}
    for state, count in await session.execute(select(Job.state, func.count()).group_by(Job.state)):
        states[state] = int(count)

    queue_wait = await _histogram(
        session,
        seconds_between(Job.started_at, Job.queued_at, dialect),
        [Job.started_at.is_not(None)],
        QUEUE_WAIT_BUCKETS,
    )
    first_metric_at = (
        select(JobMetric.created_at)
        .where(JobMetric.job_id == Job.id, JobMetric.created_at >= Job.started_at)
        .order_by(JobMetric.step)
        .limit(1)
        .correlate(Job)
        .scalar_subquery()
    )
    first_metric = await _histogram(  # (jobs with no metric yet: NULL, neither counted nor summed)
        session,
        seconds_between(first_metric_at, Job.started_at, dialect),
        [Job.started_at.is_not(None)],
        FIRST_METRIC_BUCKETS,
    )
    metric_points = await session.scalar(select(func.coalesce(func.max(JobMetric.id), literal(0))))
    log_lines = await session.scalar(select(func.coalesce(func.max(JobLog.id), literal(0))))

    workers = await live_workers(session, settings)
    active_jobs = sum(states[state.value] for state in ACTIVE_STATES)
    follower_nodes = await session.scalar(
        select(func.count()).where(
            JobNode.node_rank > 0, JobNode.state.in_([NodeState.WAITING, NodeState.RUNNING])
        )
    )
    return DatabaseSnapshot(
        jobs_by_state=states,
        queue_wait=queue_wait,
        first_metric=first_metric,
        metric_points=int(metric_points or 0),
        log_lines=int(log_lines or 0),
        live_workers=len(workers),
        worker_slots=sum(worker.slots for worker in workers),
        worker_devices=sum(worker.device_count for worker in workers),
        busy_slots=active_jobs + int(follower_nodes or 0),
    )


async def read_snapshot(
    session_factory: async_sessionmaker[AsyncSession],
    settings: Settings,
    deadline_seconds: float = SCRAPE_DEADLINE_SECONDS,
) -> DatabaseSnapshot:
    """The database's metrics now; raises on a database error or past the deadline."""

    async def read() -> DatabaseSnapshot:
        async with session_factory() as session, session.begin():
            return await _read(session, settings)

    return await asyncio.wait_for(read(), deadline_seconds)
