"""The service verbs of ``ace3``: run the service (server, worker, up), migrate, and manage API keys.

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
from pathlib import Path
from typing import Any

from ace3.cli.common import positive_int


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
    from ace3_control.log_format import uvicorn_log_config

    log_config = uvicorn_log_config(settings.log_format, settings.log_level)
    logging: dict[str, Any] = {"log_config": log_config} if log_config is not None else {}
    if settings.api_workers > 1:  # (each process builds its app from the same ACE3_* settings)
        uvicorn.run(
            "ace3_server.app:create_app",
            factory=True,
            workers=settings.api_workers,
            host=args.host,
            port=args.port,
            log_level=settings.log_level,
            **logging,
        )
        return 0
    uvicorn.run(
        create_app(settings),
        host=args.host,
        port=args.port,
        log_level=settings.log_level,
        **logging,
    )
    return 0


def worker_argv(
    settings: Any, concurrency: int | None = None, node_name: str | None = None
) -> list[str]:
    """Celery's arguments for an ``ace3 worker``; ``node_name`` (e.g. ``w1@%h``) tells several
    workers on one machine apart (Celery's default, ``celery@<host>``, is the same for all)."""
    named = ["--hostname", node_name] if node_name else []
    # JSON logs: no start-up banner on stdout either (every line a JSON object).
    quiet = ["--quiet"] if settings.log_format == "json" else []
    return [
        *quiet,
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
        *named,
    ]


def cmd_worker(args: argparse.Namespace) -> int:
    _need("worker", "ace3_worker")
    if args.concurrency is not None:
        if args.concurrency < 1:
            raise SystemExit(
                f"ace3 worker: --concurrency must be at least 1, not {args.concurrency}"
            )
        # The worker's settings divide the machine by the slots (each job's memory limit, its
        # BLAS threads, its GPUs, its share of the dataset cache): --concurrency is that number.
        os.environ["ACE3_WORKER_SLOTS"] = str(args.concurrency)
    from ace3_worker.celery_app import app

    app.worker_main(worker_argv(_settings(), args.concurrency, args.node_name))
    return 0


UP_CPU_PROCESSES = "8"  # the ACE3 document's snippets ask for num_gpus=4 and 8


def up_worker_env(env: dict[str, str], data_dir: Path, index: int, count: int) -> dict[str, str]:
    """The environment of worker ``index`` of ``count`` started by ``ace3 up``: a CPU process
    cap that admits the document's ``num_gpus=8`` (unless the user set one) and, with several
    workers, a work directory of its own and a rendezvous address on this machine."""
    worker = dict(env)
    worker.setdefault("ACE3_WORKER_CPU_PROCESSES", UP_CPU_PROCESSES)
    if count > 1:
        worker.setdefault("ACE3_WORKER_ADVERTISE_HOST", "127.0.0.1")
        worker["ACE3_WORK_DIR"] = str(data_dir / f"jobs-w{index}")
    return worker


def cmd_up(args: argparse.Namespace) -> int:
    """API and ``--workers`` workers together on the embedded defaults (or whatever ACE3_* says)."""
    settings = _settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    cmd_migrate(args)
    data_dir = settings.data_dir.resolve()
    env = dict(os.environ)
    env["ACE3_DATA_DIR"] = str(data_dir)
    base = [sys.executable, "-m", "ace3.cli"]
    children = []
    for index in range(1, args.workers + 1):
        name = ["--node-name", f"w{index}@%h"] if args.workers > 1 else []
        worker_env = up_worker_env(env, data_dir, index, args.workers)
        children.append(subprocess.Popen([*base, "worker", *name], env=worker_env))
    server = subprocess.Popen(
        [*base, "server", "--host", args.host, "--port", str(args.port)], env=env
    )
    children.insert(0, server)
    cpu = up_worker_env(env, data_dir, 1, args.workers)["ACE3_WORKER_CPU_PROCESSES"]
    print(
        f"ACE3 is up: API on http://{args.host}:{args.port} (dashboard at /ui/, docs at /docs), data in {data_dir}\n"
        f"{args.workers} worker(s), each taking jobs of up to {cpu} CPU processes "
        "(ACE3_WORKER_CPU_PROCESSES): on a CPU-only machine these processes are "
        "oversubscribed, fine for trying things out, not for speed",
        flush=True,
    )

    stopped: set[int] = set()  # the children this process sent a SIGTERM

    def stop(*_: object) -> None:
        for child in children:
            if child.poll() is None:
                stopped.add(child.pid)
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
                child.wait()
    return max(up_exit_code(child.returncode, child.pid in stopped) for child in children)


def up_exit_code(returncode: int, stopped: bool) -> int:
    """What one child of ``ace3 up`` adds to its exit code: 0 for a clean exit, and for a child
    this process stopped with SIGTERM that died of it (uvicorn re-raises the signal after its
    shutdown; a worker still starting has no handler yet); a child killed by signal N
    otherwise as 128 + N, as a shell reports it (not ``sys.exit(-N)``, which reads as 256 - N)."""
    if returncode >= 0:
        return returncode
    if stopped and -returncode == signal.SIGTERM:
        return 0
    return 128 - returncode


def add_parsers(sub: Any) -> None:
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
        "--concurrency",
        type=int,
        default=None,
        help="jobs at once: sets ACE3_WORKER_SLOTS, which every per-slot share divides by",
    )
    worker.add_argument(
        "--node-name",
        default=None,
        help="Celery node name, e.g. w1@%%h (needed when several workers share a machine)",
    )
    worker.set_defaults(func=cmd_worker)

    up = sub.add_parser(
        "up",
        help="API + worker(s) on one machine, embedded defaults (SQLite, local broker)",
        description="Run the API and worker(s) on this machine for trying ACE3 out. Workers "
        f"take jobs of up to {UP_CPU_PROCESSES} CPU processes unless ACE3_WORKER_CPU_PROCESSES "
        "says otherwise (oversubscribed on most laptops: fine for trying, not for speed).",
    )
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=8000)
    up.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="worker processes, each registered as its own worker (2: try num_nodes=2)",
    )
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
    from ace3.cli_owners import add_owners_parser

    add_owners_parser(sub)
