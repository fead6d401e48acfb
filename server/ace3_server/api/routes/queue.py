"""The queue as the caller sees it: their queued jobs with their place in line.

Workers claim jobs in the fair queue's order (``ace3_control.scheduling``): priority, then the
owners' turns, then the oldest. Positions are that order now (claims and job ends change it).
Other owners' jobs are counted, never listed.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Query
from sqlalchemy import func, select

from ace3_control.models import ACTIVE_STATES, Job, JobState
from ace3_control.scheduling import waiting_line
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
    ``position`` and ``waiting_reason``, and how many jobs of all owners are queued and
    running."""
    line = waiting_line()
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
                "priority": row.priority,
                "position": row.position,
                "waiting_reason": row.waiting_reason,
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
