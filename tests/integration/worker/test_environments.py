"""Per-job environments on real workers (in process, over one SQLite database and one store, in
the worker's real sandbox when it has one), from a wheelhouse the test writes: a job imports a
package of its environment, which is read-only and after the worker's packages on its
``sys.path``; a second job reuses the cached environment (no resolve); a second worker with its
own data directory fetches it from the store (a content-addressed archive) instead of building;
builds run on the work filesystem and leave nothing there; two concurrent preparations build
once; a package the wheelhouse lacks fails the job with the resolver's message, not
retried. The job rows carry ``requirements`` directly (what the API stores)."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select

from ace3.files import sha256_file
from ace3_control.models import (
    Environment,
    EnvironmentState,
    Job,
    JobLog,
    JobState,
    Owner,
    StoredDataset,
    StoredModel,
)
from ace3_control.settings import Settings
from ace3_server.migrations_check import upgrade
from ace3_worker.environments.prepare import EnvironmentPreparer
from ace3_worker.supervisor import Supervisor
from tests.wheelhouse import make_wheel

pytestmark = pytest.mark.slow

SANDBOX = "bwrap" if shutil.which("bwrap") and os.geteuid() == 0 else "none"

# Imports the environment's package; fails unless its directory is read-only and after the
# worker's own packages on sys.path.
MODEL = """
import os, sys
import torch
from torch import nn
import tinyext


def build_model():
    assert tinyext.VALUE == 42, tinyext.VALUE
    here = os.path.dirname(os.path.dirname(tinyext.__file__))
    assert sys.path.index(here) > sys.path.index(os.path.dirname(os.path.dirname(torch.__file__)))
    try:
        open(os.path.join(here, "tinyext", "planted.py"), "w").close()
    except OSError:
        pass
    else:
        raise RuntimeError("the environment is writable")
    return nn.Linear(8, 3)
"""


@pytest.fixture(scope="module")
def wheelhouse() -> Iterator[Path]:
    """A wheelhouse the build's unprivileged uid can read (pytest's tmp dirs are root's)."""
    root = Path(tempfile.mkdtemp(prefix="ace3-wheelhouse-"))
    root.chmod(0o755)
    make_wheel(root, "tinyext", "1.0", {"tinyext/__init__.py": "VALUE = 42\n"}, ["tinydep>=0.1"])
    make_wheel(root, "tinydep", "0.2", {"tinydep/__init__.py": "X = 1\n"})
    for wheel in root.iterdir():
        wheel.chmod(0o644)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, wheelhouse: Path
) -> Iterator[SimpleNamespace]:
    """Two workers' settings (data directories of their own) over one database and store, the
    first one's supervisor, and an owner with a model and a dataset."""
    root = tmp_path_factory.mktemp("environments")
    database = f"sqlite:///{root / 'ace3.db'}"
    upgrade(database)

    def settings(name: str) -> Settings:
        return Settings(
            data_dir=root / name,
            database_url=database,
            storage_dir=root / "store",
            sandbox=SANDBOX,
            worker_device="cpu",
            worker_slots=1,
            warm_launch=True,
            heartbeat_seconds=1,
            lease_seconds=30,
            pip_find_links=str(wheelhouse),
            pip_offline=True,
            queue_name="environments-test",
        )

    # (keeps a warm sandbox: its second job starts in one, the environment linked in after)
    first = Supervisor(settings("a"), keeps_warm_sandboxes=True)
    rng = np.random.default_rng(0)
    np.savez(root / "data.npz", inputs=rng.normal(size=(32, 8)).astype(np.float32),
             targets=rng.integers(0, 3, 32))  # fmt: skip
    (root / "model.py").write_text(MODEL)
    first.store.put_file("models/o/m/model.py", root / "model.py")
    first.store.put_file("datasets/o/d/data.npz", root / "data.npz")
    with first.sessions() as session:
        owner = Owner(name="env-owner")
        session.add(owner)
        session.flush()
        common = {"owner_id": owner.id, "name": "x", "size_bytes": 1}
        model = StoredModel(kind="file", entry_module=None, factory="build_model",
                            variant="build_model|", filename="model.py",
                            sha256=sha256_file(root / "model.py"),
                            storage_key="models/o/m/model.py", **common)  # fmt: skip
        dataset = StoredDataset(kind="file", format="npz", filename="data.npz",
                                sha256=sha256_file(root / "data.npz"),
                                storage_key="datasets/o/d/data.npz", **common)  # fmt: skip
        session.add_all([model, dataset])
        session.commit()
        ids = (owner.id, model.id, dataset.id)
    yield SimpleNamespace(first=first, settings=settings, ids=ids)
    warm = first.warm.take()  # (the sandbox prepared for a next job that never comes)
    if warm is not None:
        first.warm.discard(warm)


def _run(supervisor: Supervisor, cluster: SimpleNamespace, requirements: list[str]) -> Any:
    """A queued job asking for ``requirements``, run by ``supervisor``: the row and its log."""
    owner_id, model_id, dataset_id = cluster.ids
    with supervisor.sessions() as session:
        job = Job(owner_id=owner_id, model_id=model_id, dataset_id=dataset_id,
                  config={"epochs": 1, "batch_size": 16}, model_kwargs={}, num_processes=1,
                  request_hash="h", requirements=requirements, max_retries=2)  # fmt: skip
        session.add(job)
        session.commit()
        job_id = job.id
    supervisor.run(job_id)
    with supervisor.sessions() as session:
        row = session.get(Job, job_id)
        lines = session.scalars(
            select(JobLog.line).where(JobLog.job_id == job_id).order_by(JobLog.id)
        ).all()
        session.expunge(row)
    return SimpleNamespace(row=row, log="\n".join(lines))


def test_a_job_imports_its_package_and_the_next_reuses_the_environment(
    cluster: SimpleNamespace,
) -> None:
    first = _run(cluster.first, cluster, ["tinyext"])
    assert first.row.state == JobState.SUCCEEDED, (first.row.error, first.log)
    digest = first.row.environment_hash
    assert digest and first.row.phase is None
    assert f"ace3: environment {digest[:12]}: built in" in first.log
    assert "(2 packages: tinydep==0.2, tinyext==1.0)" in first.log
    assert "uv: " in first.log, "uv's output is in the job's log"

    again = _run(cluster.first, cluster, ["TinyExt"])  # (the same requirement, spelled otherwise)
    assert again.row.state == JobState.SUCCEEDED, (again.row.error, again.log)
    assert again.row.environment_hash == digest
    assert SANDBOX == "none" or "ace3: warm start" in again.log, again.log
    assert f"ace3: environment {digest[:12]}: reused from the cache" in again.log
    assert "uv: " not in again.log and "built in" not in again.log, "no resolve"

    other = Supervisor(cluster.settings("b"))  # (its own data directory: an empty cache)
    fetched = _run(other, cluster, ["tinyext"])
    assert fetched.row.state == JobState.SUCCEEDED, (fetched.row.error, fetched.log)
    assert f"ace3: environment {digest[:12]}: fetched from the store" in fetched.log
    assert "uv: " not in fetched.log
    with other.sessions() as session:
        [environment] = session.scalars(select(Environment)).all()
        assert environment.state == EnvironmentState.READY
        assert environment.storage_key == f"environments/{digest}/{environment.sha256}.tar.gz"
        assert environment.packages == [
            {"name": "tinydep", "version": "0.2"},
            {"name": "tinyext", "version": "1.0"},
        ]
    cache = cluster.settings("a").resolved_env_cache_dir
    assert (cache.stat().st_mode & 0o777) == 0o700, "the cache is the worker's alone"
    builds = cluster.settings("a").resolved_work_dir / ".env-builds"
    assert builds.is_dir() and not any(builds.iterdir()), "built on the work filesystem, gone"


def test_a_package_the_wheelhouse_lacks_fails_the_job_naming_it_without_a_retry(
    cluster: SimpleNamespace,
) -> None:
    done = _run(cluster.first, cluster, ["missingpkg>=1"])
    assert (done.row.state, done.row.attempt) == (JobState.FAILED, 1), "failed, not retried"
    assert done.row.error.startswith("the job's environment cannot be built: ")
    assert "Because missingpkg was not found" in done.row.error
    assert "missingpkg" in done.log and done.row.phase is None


def test_two_concurrent_preparations_build_once(cluster: SimpleNamespace) -> None:
    """Two workers (caches of their own) need the same new environment at once: one builds, the
    other waits for the row and fetches the archive."""
    plan = cluster.first.workspace.plan
    logs: dict[str, list[str]] = {"c": [], "d": []}
    how: dict[str, str] = {}
    barrier = threading.Barrier(2)

    def prepare(name: str) -> None:
        settings = cluster.settings(name)
        preparer = EnvironmentPreparer(
            settings, cluster.first.sessions, cluster.first.store, lambda: plan, f"worker-{name}"
        )
        barrier.wait()
        prepared = preparer.prepare("no-such-job", 1, ["tinydep"], logs[name].append)
        how[name] = prepared.how
        prepared.release()

    threads = [threading.Thread(target=prepare, args=(name,)) for name in logs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(how.values()) == ["built", "fetched"], (how, logs)
    built = [line for lines in logs.values() for line in lines if ": built in " in line]
    assert len(built) == 1, logs
    with cluster.first.sessions() as session:
        rows = session.scalars(
            select(Environment).where(Environment.requirements == ["tinydep"])
        ).all()
        assert [row.state for row in rows] == [EnvironmentState.READY]
