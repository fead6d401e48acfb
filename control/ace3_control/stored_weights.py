"""Model weights a job starts from by id (``init_from_checkpoint_id``): a checkpoint of one of
the owner's jobs, or weights the owner uploaded (``POST /v1/checkpoints``). One lookup for the
API (which refuses ids the caller does not own) and the worker (which copies the file into the
job's directory and checks the owner again)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Select, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from ace3_control.models import Job, JobCheckpoint, UploadedCheckpoint


@dataclass(frozen=True)
class StoredWeights:
    """Where a weights file is in the store and how to check it."""

    id: str
    name: str
    storage_key: str
    sha256: str
    size_bytes: int


def _of(row: JobCheckpoint | UploadedCheckpoint) -> StoredWeights:
    name = row.name if isinstance(row, JobCheckpoint) else "weights.safetensors"
    return StoredWeights(row.id, name, row.storage_key, row.sha256, row.size_bytes)


def _job_checkpoint_query(owner_id: str, checkpoint_id: str) -> Select[JobCheckpoint]:
    return (
        select(JobCheckpoint)
        .join(Job, Job.id == JobCheckpoint.job_id)
        .where(JobCheckpoint.id == checkpoint_id, Job.owner_id == owner_id)
    )


def _uploaded_query(owner_id: str, checkpoint_id: str) -> Select[UploadedCheckpoint]:
    return select(UploadedCheckpoint).where(
        UploadedCheckpoint.id == checkpoint_id,
        UploadedCheckpoint.owner_id == owner_id,
        UploadedCheckpoint.deleted_at.is_(None),
    )


async def find_owned_weights(
    session: AsyncSession, owner_id: str, checkpoint_id: str
) -> StoredWeights | None:
    """The owner's job checkpoint or uploaded weights with this id; None when neither."""
    for query in (_job_checkpoint_query, _uploaded_query):
        row = await session.scalar(query(owner_id, checkpoint_id))
        if row is not None:
            return _of(row)
    return None


def owned_weights(session: Session, owner_id: str, checkpoint_id: str) -> StoredWeights | None:
    """:func:`find_owned_weights` for synchronous sessions (the worker)."""
    for query in (_job_checkpoint_query, _uploaded_query):
        row = session.scalar(query(owner_id, checkpoint_id))
        if row is not None:
            return _of(row)
    return None


def required_weights(
    session: Session, owner_id: str, checkpoint_id: str, role: str
) -> StoredWeights:
    """:func:`owned_weights`, for the worker preparing a job: FileNotFoundError saying what is
    gone when the weights no longer exist (``role``: what they are to the job)."""
    weights = owned_weights(session, owner_id, checkpoint_id)
    if weights is None:
        raise FileNotFoundError(
            f"checkpoint {checkpoint_id}, {role}, is gone (pruned, or its job deleted): upload "
            "the weights again and submit a new job"
        )
    return weights
