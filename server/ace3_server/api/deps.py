"""Typed FastAPI dependencies: the database session, the settings and the calling owner.

No session outlives the route function: ``SessionDep`` is closed when the function returns,
before a streamed response starts, and authentication uses a session of its own that is closed
as soon as the key is checked (or none: a key verified in the last few seconds is cached,
``key_cache``). A long stream or a slow upload therefore holds no connection
(and no transaction) while it waits.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ace3_control.models import ApiKey
from ace3_control.settings import Settings
from ace3_control.storage import ArtifactStore
from ace3_server.auth import hash_key, key_matches, parse_lookup_prefix
from ace3_server.key_cache import KeyCache
from ace3_server.searches.wakes import DriverWakes
from ace3_server.services.publishing import Publisher

_bearer = HTTPBearer(
    auto_error=False, description="An ACE3 API key: `ace3 keys create --name NAME`."
)

UNAUTHORIZED = HTTPException(
    status_code=401,
    detail="invalid or missing API key: send 'Authorization: Bearer <key>' (create one with 'ace3 keys create')",
    headers={"WWW-Authenticate": "Bearer"},
)


async def get_session(request: Request) -> AsyncIterator[AsyncSession]:
    async with request.app.state.session_factory() as session:
        yield session


def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


def get_store(request: Request) -> ArtifactStore:
    return request.app.state.store


def get_publisher(request: Request) -> Publisher:
    return request.app.state.publisher


def get_search_driver(request: Request) -> DriverWakes:
    return request.app.state.search_driver


SessionDep = Annotated[AsyncSession, Depends(get_session, scope="function")]
SettingsDep = Annotated[Settings, Depends(get_settings_dep)]
StoreDep = Annotated[ArtifactStore, Depends(get_store)]
PublisherDep = Annotated[Publisher, Depends(get_publisher)]
SearchDriverDep = Annotated[DriverWakes, Depends(get_search_driver)]


async def owner_of_key(
    session_factory: async_sessionmaker[AsyncSession], plaintext: str
) -> str | None:
    """The owner id of a valid, unrevoked API key, or None; the session is closed on return."""
    prefix = parse_lookup_prefix(plaintext)
    if prefix is None:
        return None
    async with session_factory() as session:
        key = await session.scalar(select(ApiKey).where(ApiKey.lookup_prefix == prefix))
    if key is None or key.revoked_at is not None or not key_matches(plaintext, key.key_hash):
        return None
    return key.owner_id


async def get_owner_id(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise UNAUTHORIZED
    cache: KeyCache = request.app.state.key_cache
    key_hash = hash_key(credentials.credentials)
    owner_id = cache.owner(key_hash)
    if owner_id is not None:
        return owner_id
    owner_id = await owner_of_key(request.app.state.session_factory, credentials.credentials)
    if owner_id is None:
        raise UNAUTHORIZED
    cache.remember(key_hash, owner_id)
    return owner_id


OwnerDep = Annotated[str, Depends(get_owner_id)]
