"""The caller's job by id for every ``/openai/v1`` route (``services.jobs.get_owned_job``),
its 404 in OpenAI's shape naming the parameter the caller gave."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession
from starlette.exceptions import HTTPException

from ace3_control.models import Job
from ace3_server.openai_api.errors import OpenAIError
from ace3_server.services import jobs


async def owned_job(
    session: AsyncSession, owner_id: str, job_id: str, param: str = "fine_tuning_job_id"
) -> Job:
    """The caller's job ``job_id``; 404 (``param`` named) when it is missing or another
    owner's."""
    try:
        return await jobs.get_owned_job(session, owner_id, job_id)
    except HTTPException as exc:
        if exc.status_code != 404:
            raise
        raise OpenAIError(404, f"no fine-tuning job {job_id!r}", param=param) from None
