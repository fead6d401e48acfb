"""The ``ace3`` command: run the service (server, worker, up), migrate, and manage API keys.

Server and worker pieces are imported only by the subcommands that need them, so the plain SDK
install keeps working without them (and says which extra to install when they are missing).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any


def _need(extra: str, module: str) -> None:
    try:
        __import__(module)
    except ImportError as exc:
        raise SystemExit(
            f"ace3: this command needs the '{extra}' extra: pip install 'ace3[{extra}]' ({exc})"
        ) from exc


def _settings() -> Any:
    _need("server", "ace3_server")
    from ace3_control.settings import get_settings

    return get_settings()


def _sync_session() -> Any:
    from ace3_control.db import make_sync_engine, sync_session_factory

    return sync_session_factory(make_sync_engine(_settings().resolved_database_url))()


def cmd_migrate(_: argparse.Namespace) -> int:
    from ace3_server.migrations_check import upgrade

    settings = _settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade(settings.resolved_database_url)
    print("database migrated to the newest schema")
    return 0


def cmd_keys_create(args: argparse.Namespace) -> int:
    from ace3_server.services.keys import OwnerNotFoundError, create_key

    with _sync_session() as session:
        try:
            created = create_key(session, args.name, args.owner)
        except OwnerNotFoundError as exc:
            print(f"ace3: {exc}", file=sys.stderr)
            return 2
    if args.quiet:
        print(created.plaintext)
    else:
        print(f"API key for {args.name!r} (owner {created.owner_id}); it is shown only this once:")
        print(created.plaintext)
    return 0


def cmd_keys_list(_: argparse.Namespace) -> int:
    from ace3_server.services.keys import list_keys

    with _sync_session() as session:
        for key in list_keys(session):
            state = "revoked" if key.revoked_at else "active"
            print(
                f"{key.lookup_prefix}  {state:8}  owner={key.owner_id}  name={key.name}  created={key.created_at:%Y-%m-%d %H:%M}"
            )
    return 0


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    from ace3_server.services.keys import revoke_key

    with _sync_session() as session:
        if not revoke_key(session, args.prefix):
            print(f"ace3: no active key with prefix {args.prefix!r}", file=sys.stderr)
            return 2
    print(f"revoked key {args.prefix}")
    return 0


def cmd_server(args: argparse.Namespace) -> int:
    _need("server", "uvicorn")
    import uvicorn

    from ace3_server.app import create_app
    from ace3_server.migrations_check import DatabaseNotMigratedError, ensure_migrated

    settings = _settings()
    try:
        ensure_migrated(settings.resolved_database_url)
    except DatabaseNotMigratedError as exc:
        print(f"ace3: {exc}", file=sys.stderr)
        return 2
    if settings.api_workers > 1:  # (each process builds its app from the same ACE3_* settings)
        uvicorn.run(
            "ace3_server.app:create_app",
            factory=True,
            workers=settings.api_workers,
            host=args.host,
            port=args.port,
            log_level=settings.log_level,
        )
        return 0
    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level=settings.log_level)
    return 0


def worker_argv(settings: Any, concurrency: int | None = None) -> list[str]:
    return [
        "worker",
        "--loglevel",
        settings.log_level.upper(),
        "--concurrency",
        str(concurrency or settings.worker_slots),
        "--queues",
        settings.queue_name,
        "--prefetch-multiplier",
        "1",
        "--without-gossip",
        "--without-mingle",
    ]


def cmd_worker(args: argparse.Namespace) -> int:
    _need("worker", "ace3_worker")
    from ace3_worker.celery_app import app

    app.worker_main(worker_argv(_settings(), args.concurrency))
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    """API and one worker together on the embedded defaults (or whatever ACE3_* says)."""
    settings = _settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    cmd_migrate(args)
    env = dict(os.environ)
    env["ACE3_DATA_DIR"] = str(settings.data_dir.resolve())
    base = [sys.executable, "-m", "ace3.cli"]
    worker = subprocess.Popen([*base, "worker"], env=env)
    server = subprocess.Popen(
        [*base, "server", "--host", args.host, "--port", str(args.port)], env=env
    )
    print(
        f"ACE3 is up: API on http://{args.host}:{args.port} (docs at /docs), data in {settings.data_dir.resolve()}"
    )
    children = [server, worker]

    def stop(*_: object) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        while all(child.poll() is None for child in children):
            time.sleep(0.5)
    finally:
        stop()
        for child in children:
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
    return max((child.returncode or 0) for child in children)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ace3", description="ACE3: training as a service for PyTorch."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("migrate", help="bring the database to the newest schema").set_defaults(
        func=cmd_migrate
    )

    server = sub.add_parser(
        "server", help="run the API (production: set ACE3_DATABASE_URL, ACE3_BROKER_URL)"
    )
    server.add_argument("--host", default="127.0.0.1")
    server.add_argument("--port", type=int, default=8000)
    server.set_defaults(func=cmd_server)

    worker = sub.add_parser("worker", help="run a worker that trains jobs with torchrun")
    worker.add_argument(
        "--concurrency", type=int, default=None, help="jobs at once (default ACE3_WORKER_SLOTS)"
    )
    worker.set_defaults(func=cmd_worker)

    up = sub.add_parser(
        "up", help="API + worker on one machine, embedded defaults (SQLite, local broker)"
    )
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=8000)
    up.set_defaults(func=cmd_up)

    keys = sub.add_parser("keys", help="manage API keys").add_subparsers(
        dest="keys_command", required=True
    )
    create = keys.add_parser("create", help="create a key (printed once)")
    create.add_argument("--name", required=True, help="what the key is for")
    create.add_argument(
        "--owner", default=None, help="add the key to this owner id (default: a new owner)"
    )
    create.add_argument("--quiet", action="store_true", help="print only the key")
    create.set_defaults(func=cmd_keys_create)
    keys.add_parser("list", help="list keys (prefixes only)").set_defaults(func=cmd_keys_list)
    revoke = keys.add_parser("revoke", help="revoke a key by its prefix")
    revoke.add_argument("prefix")
    revoke.set_defaults(func=cmd_keys_revoke)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
