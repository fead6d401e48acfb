"""What creating a job and creating a search share: the request hash an Idempotency-Key replay
must match, the replay itself (or 409), the 422 listing every problem, the one insert that a
concurrent request with the same key cannot duplicate; and reading one of the caller's runs."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import HTTPException
from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from ace3_control.models import Job, Search
from ace3_server.errors import not_found

RunT = TypeVar("RunT", Job, Search)


def request_hash(body: BaseModel, extra: dict[str, Any] | None = None) -> str:
    """The hash an Idempotency-Key replay must match. Optional fields added after a body shape
    was first hashed are left out while unset, so earlier requests keep their hash. ``extra``:
    what else the request asked for that the row keeps (an OpenAI-compatible request's suffix
    and metadata), hashed with the body when given."""
    payload = body.model_dump(mode="json")
    if extra is not None:
        payload["__extra__"] = extra
    for later_field, default in (("resume_from_checkpoint", None), ("priority", "normal")):
        if payload.get(later_field) == default:
            payload.pop(later_field, None)
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


async def find_by_idempotency_key(
    session: AsyncSession, model: Any, owner_id: str, key: str
) -> Any:
    return await session.scalar(
        select(model).where(model.owner_id == owner_id, model.idempotency_key == key)
    )


def replay(existing: Any, digest: str) -> Any:
    """The earlier result of this Idempotency-Key, if the request is the same; else 409."""
    if existing.request_hash != digest:
        raise HTTPException(
            status_code=409,
            detail="this Idempotency-Key was already used for a different request; use a new key",
        )
    return existing


async def insert_once(
    session: AsyncSession, row: Any, *, idempotency_key: str | None, digest: str
) -> tuple[Any, bool]:
    """Commit a new job or search; if a concurrent request with the same Idempotency-Key won the
    race, return that one instead (or 409 when its body differs). Returns (row, created)."""
    session.add(row)
    try:
        await session.commit()
    except IntegrityError:
        await session.rollback()
        model = type(row)
        existing = await find_by_idempotency_key(
            session, model, row.owner_id, idempotency_key or ""
        )
        if existing is None:  # pragma: no cover - only the idempotency key can conflict
            raise
        return replay(existing, digest), False
    return row, True


async def create_once(
    session: AsyncSession,
    table: type[RunT],
    *,
    owner_id: str,
    body: BaseModel,
    idempotency_key: str | None,
    problems: Callable[[], Awaitable[list[dict[str, Any]]]],
    build: Callable[[str], RunT],
    extra: dict[str, Any] | None = None,
) -> tuple[RunT, bool]:
    """A replay of ``idempotency_key`` (the earlier row; 409 for a different body or
    ``extra``), else 422 with every one of ``problems()``, else ``build(request hash)`` inserted
    once. Returns (row, created)."""
    digest = request_hash(body, extra)
    if idempotency_key:
        existing = await find_by_idempotency_key(session, table, owner_id, idempotency_key)
        if existing is not None:
            return replay(existing, digest), False
    found = await problems()
    if found:
        raise HTTPException(status_code=422, detail=found)
    row, created = await insert_once(
        session, build(digest), idempotency_key=idempotency_key, digest=digest
    )
    return row, created


async def get_owned_run(
    session: AsyncSession, table: type[RunT], owner_id: str, run_id: str, what: str
) -> RunT:
    """The caller's job or search with this id; 404 naming ``what`` otherwise."""
    row = await session.get(table, run_id)
    if row is None or row.owner_id != owner_id:
        raise not_found(what)
    return row
