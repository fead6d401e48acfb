"""How far listed jobs have got: the step and epoch of each one's newest metric, in one query."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ScalarSelect, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import InstrumentedAttribute

from ace3_control.models import Job, JobMetric


async def latest_progress(
    session: AsyncSession, jobs: Sequence[Job]
) -> dict[str, dict[str, object]]:
    """``{job_id: {"step", "epoch"}}`` for the jobs that reported a metric. Each job's newest
    row is found by the (job_id, step, name) index, newest step first, so the query costs one
    index probe per job however many metrics the jobs have."""
    if not jobs:
        return {}

    def newest(column: InstrumentedAttribute[Any]) -> ScalarSelect[Any]:
        return (
            select(column)
            .where(JobMetric.job_id == Job.id)
            .order_by(JobMetric.step.desc())
            .limit(1)
            .correlate(Job)
            .scalar_subquery()
        )

    stmt = select(Job.id, newest(JobMetric.step), newest(JobMetric.epoch)).where(
        Job.id.in_([job.id for job in jobs])
    )
    return {
        job_id: {"step": step, "epoch": epoch}
        for job_id, step, epoch in (await session.execute(stmt)).all()
        if step is not None
    }
