"""The queue as the caller sees it: their queued jobs with their place in line.

Workers take jobs in the order their messages were published (the broker's queue is first in,
first out; a worker that hands a job back publishes it again, at the end): ``enqueued_at``, then
the id. Other owners' jobs are counted, never listed.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Query
from sqlalchemy import func, select

from ace3_control.models import ACTIVE_STATES, Job, JobState
from ace3_server.api.deps import OwnerDep, SessionDep
from ace3_server.api.routing import resource_router
from ace3_server.schemas import QueueOut

router = resource_router("/queue", "queue")


@router.get("", response_model=QueueOut, operation_id="get_queue")
async def get_queue(
    session: SessionDep,
    owner_id: OwnerDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> dict[str, object]:
    """The caller's queued jobs (the first ``limit`` in claim order) with their global
    ``position``, and how many jobs of all owners are queued and running."""
    position = func.row_number().over(order_by=(Job.enqueued_at, Job.id)).label("position")
    line = (
        select(
            Job.id,
            Job.owner_id,
            Job.name,
            Job.num_processes,
            Job.created_at,
            Job.queued_at,
            Job.enqueued_at,
            position,
        )
        .where(Job.state == JobState.QUEUED)
        .subquery()
    )
    rows = (
        await session.execute(
            select(line).where(line.c.owner_id == owner_id).order_by(line.c.position).limit(limit)
        )
    ).all()
    queued = await session.scalar(
        select(func.count()).select_from(Job).where(Job.state == JobState.QUEUED)
    )
    running = await session.scalar(
        select(func.count()).select_from(Job).where(Job.state.in_(ACTIVE_STATES))
    )
    return {
        "data": [
            {
                "id": row.id,
                "name": row.name,
                "position": row.position,
                "num_processes": row.num_processes,
                "created_at": row.created_at,
                "queued_at": row.queued_at,
                "enqueued_at": row.enqueued_at,
            }
            for row in rows
        ],
        "queued": queued or 0,
        "running": running or 0,
    }
