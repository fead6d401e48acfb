"""Alembic helpers: where the migrations live, upgrading, and refusing an un-migrated database."""

from __future__ import annotations

import os
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from ace3_control.db import make_sync_engine


class DatabaseNotMigratedError(RuntimeError):
    """The database schema is not at the newest migration."""


def migrations_dir() -> Path:
    configured = os.environ.get("ACE3_MIGRATIONS_DIR")
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.attributes["database_url"] = database_url
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(database_url), revision)


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("")).get_current_head()


def current_revision(database_url: str) -> str | None:
    engine = make_sync_engine(database_url)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()


def ensure_migrated(database_url: str) -> None:
    current, head = current_revision(database_url), head_revision()
    if current != head:
        raise DatabaseNotMigratedError(
            f"the database is at migration {current or '(none)'} but this server needs {head}: "
            "run `ace3 migrate` (with the same ACE3_DATABASE_URL) and start the server again"
        )
