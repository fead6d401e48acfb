"""Shared fixtures: a private Postgres database and Redis key space per test run, and the real
stack (API server and Celery worker subprocesses, which launch torchrun) started once per session.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

ADMIN_URL = os.environ.get(
    "ACE3_TEST_DATABASE_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
REDIS_HOST_PORT = os.environ.get("ACE3_TEST_REDIS", "127.0.0.1:6379")
REPO_ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _admin_connection():  # type: ignore[no-untyped-def]
    import psycopg

    try:
        return psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.fail(
            f"PostgreSQL is not reachable at {ADMIN_URL}: run `make services` (or set "
            f"ACE3_TEST_DATABASE_ADMIN_URL). {exc}"
        )


@contextlib.contextmanager
def fresh_database() -> Iterator[str]:
    """A new database, migrated to head, dropped afterwards."""
    name = f"ace3_test_{secrets.token_hex(6)}"
    with _admin_connection() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    from ace3_server.migrations_check import upgrade

    upgrade(url)
    try:
        yield url
    finally:
        with _admin_connection() as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            admin.execute(f'DROP DATABASE IF EXISTS "{name}"')


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """A fresh database for this test run, migrated to head, dropped afterwards."""
    with fresh_database() as url:
        yield url


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A Redis database number of its own (1-15) for this run; flushed afterwards."""
    import redis

    host, port = REDIS_HOST_PORT.split(":")
    number = secrets.randbelow(15) + 1
    url = f"redis://{host}:{port}/{number}"
    client = redis.Redis.from_url(url)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        pytest.fail(f"Redis is not reachable at {REDIS_HOST_PORT}: run `make services`. {exc}")
    yield url
    client.flushdb()
    client.close()


@dataclass
class Stack:
    """The running service: where it listens, its environment, and how to get API keys."""

    base_url: str
    port: int
    env: dict[str, str]
    root: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ace3.cli", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def create_key(self, name: str, owner: str | None = None) -> tuple[str, str]:
        """(api key, owner id), through the real `ace3 keys create`."""
        args = ["keys", "create", "--name", name] + (["--owner", owner] if owner else [])
        result = self.cli(*args)
        assert result.returncode == 0, result.stderr
        owner_id = re.search(r"\(owner (\w+)\)", result.stdout)
        assert owner_id, result.stdout
        return result.stdout.strip().splitlines()[-1], owner_id.group(1)

    def log_tail(self, name: str, lines: int = 60) -> str:
        path = self.root / f"{name}.log"
        return (
            "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            if path.exists()
            else ""
        )

    def worker_alive(self) -> bool:
        return self.processes["worker"].poll() is None

    def start(self, name: str, command: list[str]) -> None:
        log = (self.root / f"{name}.log").open("ab")
        # Its own session, so a test can kill the whole process tree (never pytest's group).
        self.processes[name] = subprocess.Popen(
            command,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.root,
            start_new_session=True,
        )

    def start_api(self) -> None:
        self.start("api", [sys.executable, "-m", "ace3.cli", "server", "--port", str(self.port)])
        _wait_healthy(self.base_url, self.processes["api"], self.root / "api.log")

    def kill_api(self) -> None:
        """SIGKILL the API mid-flight: no shutdown hooks run."""
        api = self.processes["api"]
        os.killpg(api.pid, signal.SIGKILL)
        api.wait()

    def start_worker(self) -> None:
        self.start("worker", [sys.executable, "-m", "ace3.cli", "worker"])

    def kill_worker(self) -> None:
        """SIGKILL the Celery worker and its pool processes, as a crash or the OOM killer would."""
        worker = self.processes["worker"]
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()


def _wait_healthy(
    base_url: str, process: subprocess.Popen[bytes], log: Path, timeout: float = 60.0
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"the API exited with {process.returncode}:\n{log.read_text()[-4000:]}"
            )
        try:
            if httpx.get(f"{base_url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"the API did not become healthy in {timeout} s:\n{log.read_text()[-4000:]}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


MAX_UPLOAD_BYTES = 3 * 1024 * 1024


@pytest.fixture(scope="session")
def object_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real S3-compatible server (SeaweedFS), once per session: an ``ObjectStore``."""
    from tests.object_store import seaweedfs

    with seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as store:
        yield store


@pytest.fixture(scope="session")
def stack(
    database_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """The real API and a real Celery worker (2 slots) over Postgres and Redis, once per session."""
    root = tmp_path_factory.mktemp("stack")
    port = free_port()
    env = stack_env(root, database_url, redis_url)
    stack = Stack(base_url=f"http://127.0.0.1:{port}", port=port, env=env, root=root)
    stack.start_worker()
    try:
        stack.start_api()
        yield stack
    finally:
        for process in stack.processes.values():
            _stop(process)
        shutil.rmtree(root / "jobs", ignore_errors=True)


def stack_env(root: Path, database_url: str, redis_url: str) -> dict[str, str]:
    """The test stack's settings: data under ``root``, a queue of its own, short periods."""
    return {
        **os.environ,
        "ACE3_DATA_DIR": str(root),
        "ACE3_DATABASE_URL": database_url,
        "ACE3_BROKER_URL": redis_url,
        "ACE3_QUEUE_NAME": f"ace3-test-{secrets.token_hex(4)}",
        "ACE3_MAX_UPLOAD_BYTES": str(MAX_UPLOAD_BYTES),
        "ACE3_HEARTBEAT_SECONDS": "1",
        "ACE3_LEASE_SECONDS": "15",
        "ACE3_CANCEL_GRACE_SECONDS": "5",
        "ACE3_RECONCILE_INTERVAL_SECONDS": "2",
        "ACE3_REPUBLISH_AFTER_SECONDS": "10",
        "ACE3_WORKER_SLOTS": "2",
        "ACE3_WORKER_DEVICE": "cpu",
        # The document's snippets ask for up to 8 processes (gloo on CPU here).
        "ACE3_WORKER_CPU_PROCESSES": "8",
        "ACE3_LOG_LEVEL": "info",
        "ACE3_SEARCH_TICK_SECONDS": "0.5",
        "ACE3_SEARCH_LEASE_SECONDS": "4",
        # The sandbox's limits, small enough for the hostile-job tests to meet them.
        "ACE3_JOB_MAX_PROCESSES": "512",
        # /metrics reads the database at every scrape here (the cache has its own unit test).
        "ACE3_METRICS_CACHE_SECONDS": "0",
        # Webhooks: the tests' receivers listen on 127.0.0.1; retries come fast.
        "ACE3_WEBHOOK_ALLOW_PRIVATE_NETWORKS": "true",
        "ACE3_WEBHOOK_RETRY_BASE_SECONDS": "0.3",
        "ACE3_WEBHOOK_POLL_SECONDS": "0.2",
        # Job environments (docs/environments.md) come from a wheelhouse the tests write
        # (tests/wheelhouse.py) into <root>/wheelhouse: no index, no network.
        "ACE3_PIP_FIND_LINKS": str(root / "wheelhouse"),
        "ACE3_PIP_OFFLINE": "true",
    }


NO_CUDA_REASON = "no CUDA device"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that uses the real stack is slow (it runs in CI all the same); every test
    marked ``gpu`` is skipped where torch sees no CUDA device (scripts/gpu-check.sh runs them
    on a GPU machine: docs/gpu-check.md)."""
    for item in items:
        if "stack" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu_items and not _cuda_device_seen():
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=NO_CUDA_REASON))


def _cuda_device_seen() -> bool:
    """Whether torch sees a CUDA device (asked once per run, only when a ``gpu`` test was
    collected; a CPU build of torch answers without touching any driver)."""
    import torch

    return bool(torch.cuda.is_available())


def load_example(name: str):  # type: ignore[no-untyped-def]
    import importlib.util

    path = REPO_ROOT / "examples" / "digits" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"ace3_example_digits_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class DigitsFiles:
    model: Path
    train: Path
    validation: Path


@pytest.fixture(scope="session")
def digits_files(tmp_path_factory: pytest.TempPathFactory) -> DigitsFiles:
    """The demo's model file and scikit-learn's digits split into train/validation .npz files."""
    directory = tmp_path_factory.mktemp("digits")
    train, validation = load_example("data").write_digits(directory)
    return DigitsFiles(REPO_ROOT / "examples" / "digits" / "model.py", train, validation)


def insert_job(session: Any, **job_fields: Any) -> Any:
    """A job row (with its owner, model and dataset) for tests of the state machine and worker."""
    from ace3_control.models import Job, Owner, StoredDataset, StoredModel

    owner = Owner(name="test-owner")
    session.add(owner)
    session.flush()
    common = {"owner_id": owner.id, "name": "x", "filename": "x", "sha256": secrets.token_hex(32),
              "size_bytes": 1, "storage_key": "k"}  # fmt: skip
    model = StoredModel(
        kind="file", entry_module=None, factory="build_model", variant="build_model|", **common
    )
    dataset = StoredDataset(kind="file", format="npz", **common)
    session.add_all([model, dataset])
    session.flush()
    fields = {
        "config": {},
        "model_kwargs": {},
        "num_processes": 1,
        "request_hash": "h",
        **job_fields,
    }
    job = Job(owner_id=owner.id, model_id=model.id, dataset_id=dataset.id, **fields)
    session.add(job)
    session.commit()
    return job
