"""What the job and search routes share (one place, used by ``routes/jobs.py`` and
``routes/searches.py``): the idempotent create's responses and status, the owner's page of runs
filtered by state, and the live event stream's response."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from fastapi import Response, status
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from sqlalchemy import ColumnElement, select
from sqlalchemy.ext.asyncio import AsyncSession

from ace3_control.models import Job, Search
from ace3_server.api.routing import error_responses
from ace3_server.services.events import until_database_outage
from ace3_server.services.pagination import paginate

#: the ``responses`` of a live event stream's route (404 for another owner's run)
EVENT_STREAM_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}},
    **error_responses(404),
}


def create_responses(out: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` of an idempotent create: 201 (the route's), 200 for a replay of an
    earlier request with the same Idempotency-Key, 400 and 409."""
    return {
        200: {
            "model": out,
            "description": "Replay of an earlier request with this Idempotency-Key.",
        },
        **error_responses(400, 409),
    }


def set_created_status(response: Response, created: bool) -> None:
    """201 for a new row, 200 for a replay."""
    response.status_code = status.HTTP_201_CREATED if created else status.HTTP_200_OK


async def owned_page(
    session: AsyncSession,
    table: type[Job] | type[Search],
    *,
    owner_id: str,
    state: str | None,
    cursor: str | None,
    limit: int,
    where: tuple[ColumnElement[bool], ...] = (),
) -> tuple[list[Any], str | None]:
    """One page (newest first) of the owner's jobs or searches, in ``state`` when given."""
    stmt = select(table).where(table.owner_id == owner_id, *where)
    if state is not None:
        stmt = stmt.where(table.state == state)
    return await paginate(session, stmt, table, owner_id=owner_id, cursor=cursor, limit=limit)


def event_stream(stream: AsyncGenerator[str, None]) -> StreamingResponse:
    """Server-sent events, unbuffered, ended by an ``error`` event on a database outage."""
    return StreamingResponse(
        until_database_outage(stream),
        media_type="text/event-stream",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
    )
