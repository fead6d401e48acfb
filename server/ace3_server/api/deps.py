"""Typed FastAPI dependencies: the database session, the settings and the calling owner."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from ace3_server.auth import key_matches, parse_lookup_prefix
from ace3_server.models import ApiKey
from ace3_server.queue import JobPublisher
from ace3_server.settings import Settings
from ace3_server.storage import LocalArtifactStore

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


def get_store(request: Request) -> LocalArtifactStore:
    return request.app.state.store


def get_publisher(request: Request) -> JobPublisher:
    return request.app.state.publisher


SessionDep = Annotated[AsyncSession, Depends(get_session)]
SettingsDep = Annotated[Settings, Depends(get_settings_dep)]
StoreDep = Annotated[LocalArtifactStore, Depends(get_store)]
PublisherDep = Annotated[JobPublisher, Depends(get_publisher)]


async def get_owner_id(
    session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise UNAUTHORIZED
    plaintext = credentials.credentials
    prefix = parse_lookup_prefix(plaintext)
    if prefix is None:
        raise UNAUTHORIZED
    key = await session.scalar(select(ApiKey).where(ApiKey.lookup_prefix == prefix))
    if key is None or key.revoked_at is not None or not key_matches(plaintext, key.key_hash):
        raise UNAUTHORIZED
    return key.owner_id


OwnerDep = Annotated[str, Depends(get_owner_id)]
