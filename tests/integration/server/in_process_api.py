"""An API of its own for a test module: the real app under uvicorn in a thread, with settings
the session's stack does not have (over the session's database)."""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from ace3_control.models import ApiKey
from ace3_control.settings import Settings
from ace3_server.app import create_app
from ace3_server.auth import generate_key
from tests.conftest import free_port


@contextlib.contextmanager
def serve(settings: Settings, background_loops: bool = False) -> Iterator[tuple[Any, str]]:
    """(the app, its base URL) while it runs; background loops (reconciler, search driver,
    webhook deliveries) off unless asked for."""
    app = create_app(settings, run_background_loops=background_loops)
    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=1
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the API did not start"
        time.sleep(0.05)
    try:
        yield app, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def add_key(session: Any, owner_id: str) -> tuple[str, str]:
    """(plaintext, key id) of a new key of ``owner_id`` (committed)."""
    key = generate_key()
    row = ApiKey(owner_id=owner_id, name="test", lookup_prefix=key.lookup_prefix,
                 key_hash=key.key_hash)  # fmt: skip
    session.add(row)
    session.commit()
    return key.plaintext, row.id


@dataclass
class Served:
    """An API of its own: its base URL, one API key per owner, its database and settings."""

    base: str
    keys: list[str]
    database_url: str
    settings: Settings


@contextlib.contextmanager
def serve_owners(redis_url: str, data_dir: Path, label: str, owners: int = 1) -> Iterator[Served]:
    """An API of its own over a fresh database with ``owners`` owners (a key each),
    publishing to a queue no worker reads (jobs stay queued)."""
    from ace3_control.db import make_sync_engine, sync_session_factory
    from tests.conftest import fresh_database, insert_job

    with fresh_database() as url:
        engine = make_sync_engine(url)
        with sync_session_factory(engine)() as session:
            keys = [
                add_key(session, insert_job(session, state="cancelled").owner_id)[0]
                for _ in range(owners)
            ]
        engine.dispose()
        settings = Settings(
            data_dir=data_dir,
            database_url=url,
            broker_url=redis_url,
            queue_name=f"ace3-{label}-{secrets.token_hex(4)}",  # no worker reads it
        )
        with serve(settings) as (_, base):
            yield Served(base, keys, url, settings)


@contextlib.contextmanager
def serve_one_owner(redis_url: str, data_dir: Path, label: str) -> Iterator[tuple[str, str]]:
    """(the base URL, an owner's API key) of :func:`serve_owners` with one owner."""
    with serve_owners(redis_url, data_dir, label) as served:
        yield served.base, served.keys[0]
