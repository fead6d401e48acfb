"""Keeps the queue honest: re-publishes queued jobs nobody claimed, expires dead leases, and
fails queued jobs no live worker can run once they waited ``ACE3_UNSCHEDULABLE_AFTER_SECONDS``.

Celery messages only say "there is work"; the rows are the truth. A message lost between the
commit and the publish, or swallowed by a dying worker, is made good here; a job whose worker
stopped heartbeating is queued again (its next attempt resumes from the last checkpoint) while
its retry budget lasts, and failed after that. Every change is a conditional update, so several
API replicas may run this at once.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ace3_control import job_transitions, worker_registry
from ace3_control.capacity import JobNeeds, cluster_problem
from ace3_control.db import rows_changed
from ace3_control.models import Job, JobState, utcnow
from ace3_control.queue import JobPublisher
from ace3_control.settings import Settings
from ace3_server.services.jobs import publish_safely

logger = logging.getLogger(__name__)


async def reconcile_once(
    session_factory: async_sessionmaker[AsyncSession], publisher: JobPublisher, settings: Settings
) -> None:
    now = utcnow()
    to_publish: list[str] = []
    async with session_factory() as session:
        expired = (
            await session.scalars(select(Job).where(job_transitions.expired_lease_condition(now)))
        ).all()
        for job in expired:
            reason = f"worker {job.worker_id} stopped heartbeating (lease expired) during attempt {job.attempt}"
            if job.cancel_requested:
                stmt = job_transitions.finish(job.id, job.attempt, JobState.CANCELLED, error=reason)
            elif job.attempt <= job.max_retries + job.micro_batch_halvings + job.preemptions:
                stmt = job_transitions.requeue_for_retry(job.id, job.attempt, reason)
                to_publish.append(job.id)
            else:
                stmt = job_transitions.finish(
                    job.id, job.attempt, JobState.FAILED, error=reason + "; no retries left"
                )
            await session.execute(stmt)
            logger.warning("job %s: %s", job.id, reason)
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
    session_factory: async_sessionmaker[AsyncSession], publisher: JobPublisher, settings: Settings
) -> None:
    while True:
        try:
            await reconcile_once(session_factory, publisher, settings)
        except Exception:
            logger.exception("reconciler pass failed; trying again next interval")
        await asyncio.sleep(settings.reconcile_interval_seconds)
