"""Cursor pagination, newest first: the cursor is the id of the last row of the previous page."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, and_, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from ace3_server.errors import field_error


async def paginate(
    session: AsyncSession,
    stmt: Select[Any],
    model: Any,
    *,
    owner_id: str,
    cursor: str | None,
    limit: int,
) -> tuple[list[Any], str | None]:
    if cursor:
        anchor_row = await session.get(model, cursor)
        if anchor_row is None or anchor_row.owner_id != owner_id:
            raise field_error(
                ["query", "cursor"], "unknown cursor: pass the next_cursor of the previous page"
            )
        anchor = select(model.created_at).where(model.id == cursor).scalar_subquery()
        stmt = stmt.where(
            or_(model.created_at < anchor, and_(model.created_at == anchor, model.id < cursor))
        )
    stmt = stmt.order_by(model.created_at.desc(), model.id.desc()).limit(limit + 1)
    rows = list((await session.scalars(stmt)).all())
    next_cursor = rows[limit - 1].id if len(rows) > limit else None
    return rows[:limit], next_cursor
