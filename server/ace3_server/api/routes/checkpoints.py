"""Checkpoints across the caller's jobs: find stored checkpoints by their content hash.

A checkpoint file downloaded earlier is identified by its sha256, so a client can map it back
to a checkpoint id (to start a new job from it with ``resume_from_checkpoint``).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Query
from sqlalchemy import select

from ace3_control.models import Job, JobCheckpoint
from ace3_server.api.deps import OwnerDep, SessionDep
from ace3_server.api.routing import resource_router
from ace3_server.schemas import CheckpointList

router = resource_router("/checkpoints", "checkpoints")


@router.get("", response_model=CheckpointList, operation_id="find_checkpoints")
async def find_checkpoints(
    session: SessionDep,
    owner_id: OwnerDep,
    sha256: Annotated[
        str,
        Query(
            pattern="^[0-9a-fA-F]{64}$",
            description="The sha256 of the checkpoint file (64 hex digits).",
        ),
    ],
) -> dict[str, object]:
    """Every stored checkpoint of the caller's jobs with these bytes, newest first."""
    stmt = (
        select(JobCheckpoint)
        .join(Job, Job.id == JobCheckpoint.job_id)
        .where(Job.owner_id == owner_id, JobCheckpoint.sha256 == sha256.lower())
        .order_by(JobCheckpoint.created_at.desc(), JobCheckpoint.id)
    )
    return {"data": (await session.scalars(stmt)).all()}
