"""Database engines and sessions: async for the API, sync for the worker, one URL for both."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, cast

from sqlalchemy import Engine, Insert, create_engine, event
from sqlalchemy.engine import CursorResult, Result, make_url
from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

DATABASE_UNAVAILABLE_ERRORS: tuple[type[Exception], ...] = (
    OperationalError,
    InterfaceError,
    DisconnectionError,
    PoolTimeoutError,
    ConnectionError,
)
"""What a lost database raises: refused or dropped connections, an exhausted pool."""


def _driver_url(url: str, *, is_async: bool) -> str:
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "postgresql":
        return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    if backend == "sqlite":
        driver = "sqlite+aiosqlite" if is_async else "sqlite"
        return parsed.set(drivername=driver).render_as_string(hide_password=False)
    raise ValueError(
        f"unsupported database URL {parsed.drivername!r}: use postgresql:// or sqlite:///"
    )


def libpq_url(url: str) -> str:
    """A Postgres URL as libpq (psycopg's own connect) reads it, without a driver name."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        raise ValueError(f"not a Postgres URL: {parsed.drivername!r}")
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


def async_url(url: str) -> str:
    return _driver_url(url, is_async=True)


def sync_url(url: str) -> str:
    return _driver_url(url, is_async=False)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def make_sync_engine(url: str, *, pooled: bool = True) -> Engine:
    """``pooled=False`` opens a connection per session and closes it after: for a process that
    forks (a child must never inherit an open connection) and writes rarely."""
    options: dict[str, Any] = {"pool_pre_ping": True} if pooled else {"poolclass": NullPool}
    engine = create_engine(sync_url(url), **options)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def make_async_engine(url: str, *, application_name: str | None = None) -> AsyncEngine:
    """``application_name`` names the connections on Postgres (``pg_stat_activity``)."""
    options: dict[str, Any] = {"pool_pre_ping": True}
    if application_name and make_url(url).get_backend_name() == "postgresql":
        options["connect_args"] = {"application_name": application_name}
    engine = create_async_engine(async_url(url), **options)
    if engine.dialect.name == "sqlite":
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
    return engine


def sync_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def async_session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


async def session_scope(factory: async_sessionmaker[AsyncSession]) -> AsyncIterator[AsyncSession]:
    async with factory() as session:
        yield session


def rows_changed(result: Result[*tuple[Any, ...]]) -> int:
    """The rows an UPDATE, DELETE or INSERT changed: ``Session.execute`` is typed to return a
    plain Result, and for these statements it is the CursorResult that counts them."""
    return cast("CursorResult[*tuple[Any, ...]]", result).rowcount


def insert_ignoring_duplicates(dialect_name: str, table: Any, rows: list[dict[str, Any]]) -> Insert:
    """INSERT ... ON CONFLICT DO NOTHING: reports are stored idempotently by their natural key."""
    if dialect_name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as postgresql_insert

        return postgresql_insert(table).values(rows).on_conflict_do_nothing()
    if dialect_name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(table).values(rows).on_conflict_do_nothing()
    raise ValueError(f"unsupported dialect {dialect_name}")  # pragma: no cover - only these two
