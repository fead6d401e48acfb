"""The real service over Postgres and Redis for the server benchmarks (streams.py, api.py).

A private database (created from ``ACE3_TEST_DATABASE_ADMIN_URL``, migrated to head, dropped
afterwards), a Redis database number, and the API started as its own process through
``benchmarks/counting_server.py`` (the app ``ace3 server`` runs, plus a count of the SQL
statements it executes, read with :meth:`Api.queries`). Rows the benchmarks need (an owner, a
key, a running job) are written directly, as the worker would.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg

ADMIN_URL = os.environ.get(
    "ACE3_TEST_DATABASE_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("ACE3_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def database() -> Iterator[str]:
    name = f"ace3_bench_{secrets.token_hex(4)}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    try:
        from ace3_server.migrations_check import upgrade

        upgrade(url)
        yield url
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            admin.execute(f'DROP DATABASE IF EXISTS "{name}"')


@dataclass
class Api:
    base_url: str
    process: subprocess.Popen[bytes]
    count_file: Path

    def queries(self) -> int:
        """SQL statements the API process(es) executed so far."""
        total = 0
        for path in self.count_file.parent.glob(self.count_file.name + "*"):
            with contextlib.suppress(ValueError, OSError):
                total += int(path.read_text() or 0)
        return total


@contextlib.contextmanager
def api(
    database_url: str,
    env: dict[str, str] | None = None,
    workers: int = 1,
    script: str = "counting_server.py",
) -> Iterator[Api]:
    """The API (``ace3 server``'s app under uvicorn, ``workers`` processes) with ``env`` on top
    of the benchmark's; ``script`` another server taking the same arguments."""
    with tempfile.TemporaryDirectory() as data_dir:
        port = free_port()
        count_file = Path(data_dir) / "queries"
        full_env = {
            **os.environ,
            "ACE3_DATA_DIR": data_dir,
            "ACE3_DATABASE_URL": database_url,
            "ACE3_BROKER_URL": REDIS_URL,
            "ACE3_LOG_LEVEL": "warning",
            # (the benchmarks' job rows have no worker: the reconciler must leave them be)
            "ACE3_RECONCILE_INTERVAL_SECONDS": "3600",
            "ACE3_BENCH_QUERY_COUNT_FILE": str(count_file),
            **(env or {}),
        }
        log = (Path(data_dir) / "api.log").open("wb")
        process = subprocess.Popen(
            [sys.executable, str(HERE / script), "--port", str(port), "--workers", str(workers)],
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        base_url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((Path(data_dir) / "api.log").read_text()[-3000:])
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{base_url}/healthz", timeout=2).status_code == 200:
                        break
                time.sleep(0.2)
            yield Api(base_url, process, count_file)
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.close()


def owner_key_and_job(database_url: str, **job_fields: Any) -> tuple[str, str]:
    """(api key, job id): a new owner with a key and a running job (its model and dataset)."""
    from datetime import timedelta

    from ace3_control.db import make_sync_engine, sync_session_factory
    from ace3_control.models import ApiKey, Job, Owner, StoredDataset, StoredModel, utcnow
    from ace3_server.auth import generate_key

    engine = make_sync_engine(database_url)
    try:
        with sync_session_factory(engine)() as session:
            owner = Owner(name="bench")
            session.add(owner)
            session.flush()
            key = generate_key()
            session.add(ApiKey(owner_id=owner.id, name="bench", lookup_prefix=key.lookup_prefix,
                               key_hash=key.key_hash))  # fmt: skip
            common = {"owner_id": owner.id, "name": "x", "filename": "x", "size_bytes": 1,
                      "sha256": secrets.token_hex(32), "storage_key": "k"}  # fmt: skip
            model = StoredModel(kind="file", entry_module=None, factory="build_model",
                                variant="build_model|", **common)  # fmt: skip
            dataset = StoredDataset(kind="file", format="npz", **common)
            session.add_all([model, dataset])
            session.flush()
            fields = {"state": "running", "attempt": 1, "worker_id": "bench",
                      "lease_expires_at": utcnow() + timedelta(hours=1), "config": {},
                      "model_kwargs": {}, "num_processes": 1, "request_hash": "h", **job_fields}  # fmt: skip
            job = Job(owner_id=owner.id, model_id=model.id, dataset_id=dataset.id, **fields)
            session.add(job)
            session.commit()
            return key.plaintext, job.id
    finally:
        engine.dispose()
