"""Keeps the queue honest: re-queues the jobs of dead workers, expires dead leases, re-publishes
queued jobs nobody claimed, and fails queued jobs no live worker can run once they waited
``ACE3_UNSCHEDULABLE_AFTER_SECONDS``.

Celery messages only say "there is work"; the rows are the truth. A message lost between the
commit and the publish, or swallowed by a dying worker, is made good here. A job whose worker is
known dead (its registry row stopped changing for the staleness window, or is gone:
``ace3_control.orphans``) is queued again at once, without waiting for its lease; a job whose
lease expired is too (the backstop when nothing else tells). Its next attempt resumes from the
last checkpoint while its retry budget lasts, and it fails after that. Every change is a
conditional update fenced by the attempt, so several API replicas may run this at once, and a
worker that was only slow finds the job no longer its own at its next heartbeat and stops.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ace3_control import job_transitions, worker_registry
from ace3_control.capacity import JobNeeds, cluster_problem
from ace3_control.db import rows_changed
from ace3_control.models import (
    ACTIVE_STATES,
    Job,
    JobNode,
    JobState,
    NodeState,
    Worker,
    utcnow,
)
from ace3_control.orphans import HeartbeatWatch, WorkerRow, is_registry_id, orphaned
from ace3_control.settings import Settings
from ace3_server.services.jobs import publish_safely
from ace3_server.services.publishing import Publisher

logger = logging.getLogger(__name__)


async def reconcile_once(
    session_factory: async_sessionmaker[AsyncSession],
    publisher: Publisher,
    settings: Settings,
    watch: HeartbeatWatch | None = None,
) -> None:
    """One pass. ``watch`` remembers the workers' rows between passes (:func:`run_reconciler`
    keeps one); without it, dead workers' jobs wait for their lease."""
    now = utcnow()
    to_publish: list[str] = []
    async with session_factory() as session:
        if watch is not None:
            await requeue_orphans(session, watch, to_publish)
        expired = (
            await session.scalars(select(Job).where(job_transitions.expired_lease_condition(now)))
        ).all()
        for job in expired:
            reason = f"worker {job.worker_id} stopped heartbeating (lease expired) during attempt {job.attempt}"
            await end_attempt(session, job, reason, to_publish)
        await fail_unschedulable(session, settings, now)
        stale_before = now - timedelta(seconds=settings.republish_after_seconds)
        stale = (
            await session.scalars(
                select(Job.id)
                .where(Job.state == JobState.QUEUED, Job.enqueued_at < stale_before)
                .limit(500)
            )
        ).all()
        for job_id in stale:
            result = await session.execute(job_transitions.mark_republished(job_id, stale_before))
            if rows_changed(result):
                to_publish.append(job_id)
        await session.execute(worker_registry.forget_long_gone(now))
        await session.commit()
    for job_id in to_publish:
        await publish_safely(publisher, job_id)


async def end_attempt(session: AsyncSession, job: Job, reason: str, to_publish: list[str]) -> None:
    """The attempt's worker is gone: cancel the job if a cancel was asked, else queue its next
    attempt while the retry budget lasts (``to_publish`` gets its id), else fail it. Fenced by
    the attempt: a job that moved on meanwhile is left alone."""
    requeue = False
    if job.cancel_requested:
        stmt = job_transitions.finish(job.id, job.attempt, JobState.CANCELLED, error=reason)
    elif job.attempt <= job.max_retries + job.micro_batch_halvings + job.preemptions:
        stmt = job_transitions.requeue_for_retry(job.id, job.attempt, reason)
        requeue = True
    else:
        stmt = job_transitions.finish(
            job.id, job.attempt, JobState.FAILED, error=reason + "; no retries left"
        )
    if rows_changed(await session.execute(stmt)):
        logger.warning("job %s: %s", job.id, reason)
        if requeue:
            to_publish.append(job.id)


async def requeue_orphans(
    session: AsyncSession, watch: HeartbeatWatch, to_publish: list[str]
) -> None:
    """Read the rows of the workers holding active jobs (each job's own worker and the nodes of
    running multi-node attempts), record them on ``watch``, and end the attempts of the jobs one
    of whose workers is dead (``ace3_control.orphans.orphaned``)."""
    holders: dict[str, set[str]] = defaultdict(set)
    for job_id, worker_id in (
        await session.execute(
            select(Job.id, Job.worker_id).where(
                Job.state.in_(ACTIVE_STATES), Job.worker_id.is_not(None)
            )
        )
    ).all():
        if worker_id is not None:
            holders[job_id].add(worker_id)
    for job_id, worker_id in (
        await session.execute(
            select(JobNode.job_id, JobNode.worker_id)
            .join(Job, (Job.id == JobNode.job_id) & (Job.attempt == JobNode.attempt))
            .where(Job.state.in_(ACTIVE_STATES), JobNode.state == NodeState.RUNNING)
        )
    ).all():
        holders[job_id].add(worker_id)
    ids = {w for workers in holders.values() for w in workers if is_registry_id(w)}
    rows = {worker_id: WorkerRow(None) for worker_id in ids}
    if ids:
        for worker_id, last_seen_at, heartbeat_seconds in (
            await session.execute(
                select(Worker.id, Worker.last_seen_at, Worker.heartbeat_seconds).where(
                    Worker.id.in_(ids)
                )
            )
        ).all():
            rows[worker_id] = WorkerRow(last_seen_at, float(heartbeat_seconds))
    watch.observe(rows)
    for orphan in orphaned(holders, rows, watch):
        job = await session.get(Job, orphan.job_id)
        if job is None or job.state not in ACTIVE_STATES:
            continue
        reason = f"{orphan.reason} during attempt {job.attempt}"
        await end_attempt(session, job, reason, to_publish)


async def fail_unschedulable(session: AsyncSession, settings: Settings, now: datetime) -> None:
    """Fail queued jobs that waited ``unschedulable_after_seconds`` while live workers exist and
    none of them can run the job (too few devices, nccl without a CUDA worker, or fewer fitting
    workers than ``num_nodes``). With no live worker at all nothing is failed: the job waits."""
    waited_since = now - timedelta(seconds=settings.unschedulable_after_seconds)
    waiting = (
        await session.execute(
            select(Job.id, Job.config, Job.num_processes)
            .where(Job.state == JobState.QUEUED, Job.queued_at < waited_since)
            .limit(500)
        )
    ).all()
    if not waiting:
        return
    workers = await worker_registry.live_workers(session, settings, now)
    for job_id, config, num_processes in waiting:
        needs = JobNeeds.from_job(int(num_processes), config)
        problem = cluster_problem(needs, workers)
        if problem is None:
            continue
        error = (
            f"no live worker can run this job, after it waited "
            f"{settings.unschedulable_after_seconds:g} s (ACE3_UNSCHEDULABLE_AFTER_SECONDS): "
            f"{problem.message}"
        )
        result = await session.execute(job_transitions.fail_queued(job_id, error))
        if rows_changed(result):
            logger.warning("job %s: %s", job_id, error)


async def run_reconciler(
    session_factory: async_sessionmaker[AsyncSession], publisher: Publisher, settings: Settings
) -> None:
    """Every ``ACE3_RECONCILE_INTERVAL_SECONDS``, with one :class:`HeartbeatWatch` for the life
    of the API process (forgotten after a failed pass: the database may have been down for the
    workers' heartbeats too)."""
    watch = HeartbeatWatch(settings)
    while True:
        try:
            await reconcile_once(session_factory, publisher, settings, watch)
        except Exception:
            watch.reset()
            logger.exception("reconciler pass failed; trying again next interval")
        await asyncio.sleep(settings.reconcile_interval_seconds)
