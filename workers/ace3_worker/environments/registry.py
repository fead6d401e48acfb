"""The cluster's record of its environments (:class:`ace3_control.models.Environment`), which is
also the lock that makes each one built once: every statement is one conditional write, the
same on SQLite and Postgres.

- The first worker that needs an environment inserts its row (``building``, ``builder``: that
  worker, a lease): an insert that fails on the primary key means someone else has it.
- A ``building`` row whose lease expired (its builder died) is taken over by one ``UPDATE ...
  WHERE state = 'building' AND lease_expires_at < now``: one taker wins.
- A ``failed`` row, and a ``ready`` row whose archive cannot be used (missing, not matching its
  sha256, broken), are taken over the same way when a job needs the environment again (the
  wheelhouse may have changed since); a ``ready`` row only while it still names the archive the
  taker found unusable, so a row another worker has just rebuilt is left alone.
- The builder renews its lease while it builds (and once more right before it uploads), and ends
  the row ``ready`` (the archive's key, sha256, sizes, what it added), ``failed`` (a definitive
  refusal, with the reason), or deletes it when its build stopped for a reason that may pass or
  its job was cancelled (whoever needs it next builds it); each of these is fenced by the
  builder's name, so a builder that lost its lease changes nothing (``mark_ready`` returning
  False says so).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ace3_control.db import rows_changed
from ace3_control.models import Environment, EnvironmentState, utcnow
from ace3_worker.environments.identity import EnvironmentIdentity
from ace3_worker.environments.uv_commands import Pin


@dataclass(frozen=True)
class RowView:
    """What a waiter reads of a row (detached from its session)."""

    state: str
    builder: str | None
    lease_live: bool
    storage_key: str | None
    sha256: str | None
    error: str | None


def read(session: Session, environment_hash: str) -> RowView | None:
    row = session.get(Environment, environment_hash, populate_existing=True)
    if row is None:
        return None
    expires = row.lease_expires_at
    return RowView(
        row.state,
        row.builder,
        expires is not None and expires > utcnow(),
        row.storage_key,
        row.sha256,
        row.error,
    )


def insert_building(
    session: Session, identity: EnvironmentIdentity, builder: str, lease_seconds: float
) -> bool:
    """Insert the row as ``builder``'s build (committed); False when a row exists already."""
    now = utcnow()
    session.add(
        Environment(
            hash=identity.hash,
            state=EnvironmentState.BUILDING,
            requirements=list(identity.requirements),
            python=identity.python,
            platform=identity.platform,
            constraints_sha256=identity.constraints_sha256,
            builder=builder,
            lease_expires_at=now + timedelta(seconds=lease_seconds),
            created_at=now,
            last_used_at=now,
        )
    )
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        return False
    return True


def take_over(
    session: Session,
    environment_hash: str,
    builder: str,
    lease_seconds: float,
    *,
    from_state: str,
    storage_key: str | None = None,
) -> bool:
    """Make the row ``builder``'s build when it is in ``from_state`` (``building``: only once
    its lease expired; with ``storage_key``: only while it names that archive); committed.
    Whether this call won it."""
    now = utcnow()
    conditions: list[Any] = [
        Environment.hash == environment_hash,
        Environment.state == from_state,
    ]
    if from_state == EnvironmentState.BUILDING:
        conditions.append(Environment.lease_expires_at < now)
    if storage_key is not None:
        conditions.append(Environment.storage_key == storage_key)
    result = session.execute(
        update(Environment)
        .where(*conditions)
        .values(
            state=EnvironmentState.BUILDING,
            builder=builder,
            lease_expires_at=now + timedelta(seconds=lease_seconds),
            error=None,
        )
        .execution_options(synchronize_session=False)
    )
    session.commit()
    return _changed(result)


def renew(session: Session, environment_hash: str, builder: str, lease_seconds: float) -> bool:
    """Extend ``builder``'s lease (committed); False when the build is no longer its."""
    result = session.execute(
        _own(environment_hash, builder).values(
            lease_expires_at=utcnow() + timedelta(seconds=lease_seconds)
        )
    )
    session.commit()
    return _changed(result)


def mark_ready(
    session: Session,
    environment_hash: str,
    builder: str,
    *,
    storage_key: str,
    sha256: str,
    archive_bytes: int,
    size_bytes: int,
    packages: tuple[Pin, ...],
    build_seconds: float,
) -> bool:
    now = utcnow()
    result = session.execute(
        _own(environment_hash, builder).values(
            state=EnvironmentState.READY,
            storage_key=storage_key,
            sha256=sha256,
            archive_bytes=archive_bytes,
            size_bytes=size_bytes,
            packages=[{"name": pin.name, "version": pin.version} for pin in packages],
            build_seconds=build_seconds,
            error=None,
            lease_expires_at=None,
            ready_at=now,
            last_used_at=now,
        )
    )
    session.commit()
    return _changed(result)


def mark_failed(session: Session, environment_hash: str, builder: str, error: str) -> bool:
    result = session.execute(
        _own(environment_hash, builder).values(
            state=EnvironmentState.FAILED, error=error[:4000], lease_expires_at=None
        )
    )
    session.commit()
    return _changed(result)


def release(session: Session, environment_hash: str, builder: str) -> bool:
    """``builder`` gives its build up (its job was cancelled, or the build failed for a reason
    that may pass): the row goes (committed), so that the next worker that needs the
    environment inserts it again and builds."""
    result = session.execute(
        delete(Environment)
        .where(
            Environment.hash == environment_hash,
            Environment.state == EnvironmentState.BUILDING,
            Environment.builder == builder,
        )
        .execution_options(synchronize_session=False)
    )
    session.commit()
    return _changed(result)


def touch(session: Session, environment_hash: str) -> None:
    """A job used the environment now (committed)."""
    session.execute(
        update(Environment)
        .where(Environment.hash == environment_hash)
        .values(last_used_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    session.commit()


def _own(environment_hash: str, builder: str) -> Any:
    return (
        update(Environment)
        .where(
            Environment.hash == environment_hash,
            Environment.state == EnvironmentState.BUILDING,
            Environment.builder == builder,
        )
        .execution_options(synchronize_session=False)
    )


def _changed(result: Any) -> bool:
    return rows_changed(result) == 1
