"""The environments row as the cluster's build lock (on SQLite: one conditional write each), and
a machine's environment cache: trees linked into jobs read-only, the least recently used
evicted first, a pinned one never."""

from __future__ import annotations

import os
import secrets
import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.models import Environment, EnvironmentState, utcnow
from ace3_server.migrations_check import upgrade
from ace3_worker.environments import registry
from ace3_worker.environments.archive import pack, unpack
from ace3_worker.environments.cache import EnvironmentCache, link_tree
from ace3_worker.environments.identity import EnvironmentIdentity, environment_identity
from ace3_worker.environments.uv_commands import Pin


@pytest.fixture(params=["sqlite", "postgres"])
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> sessionmaker[Session]:
    if request.param == "postgres":
        url = request.getfixturevalue("database_url")  # (migrated; shared by the session)
    else:
        url = f"sqlite:///{tmp_path / 'ace3.db'}"
        upgrade(url)
    return sync_session_factory(make_sync_engine(url))


def _identity() -> EnvironmentIdentity:
    """An environment of its own (the Postgres database is shared by the session's tests)."""
    return environment_identity([f"pkg-{secrets.token_hex(4)}"], installed={"torch": "2.13.0"})


def test_one_worker_builds_and_an_expired_lease_is_taken_over_once(
    sessions: sessionmaker[Session],
) -> None:
    identity = _identity()
    digest = identity.hash
    with sessions() as session:
        assert registry.insert_building(session, identity, "a", 60)
        assert not registry.insert_building(session, identity, "b", 60), "a has it"
        assert not registry.take_over(session, digest, "b", 60, from_state="building")
        view = registry.read(session, digest)
        assert view is not None and (view.state, view.builder, view.lease_live) == (
            "building",
            "a",
            True,
        )
        assert registry.renew(session, digest, "a", 60)
        assert not registry.renew(session, digest, "b", 60), "only the builder renews"
        session.execute(
            update(Environment)
            .where(Environment.hash == digest)
            .values(lease_expires_at=utcnow() - timedelta(seconds=1))
        )
        session.commit()
        assert registry.take_over(session, digest, "b", 60, from_state="building")
        assert not registry.take_over(session, digest, "c", 60, from_state="building")
        assert not registry.mark_failed(session, digest, "a", "late"), "a lost its lease"
        assert registry.mark_ready(
            session, digest, "b", storage_key="k", sha256="0" * 64, archive_bytes=1,
            size_bytes=2, packages=(Pin("einops", "0.8"),), build_seconds=0.5,
        )  # fmt: skip
        row = session.get(Environment, digest, populate_existing=True)
        assert row is not None and row.state == EnvironmentState.READY
        assert row.packages == [{"name": "einops", "version": "0.8"}]


def test_a_failed_build_is_built_again_by_one_worker(sessions: sessionmaker[Session]) -> None:
    identity = _identity()
    digest = identity.hash
    with sessions() as session:
        assert registry.insert_building(session, identity, "a", 60)
        assert registry.mark_failed(session, digest, "a", "no wheel for einops")
        view = registry.read(session, digest)
        assert view is not None and view.error == "no wheel for einops"
        assert registry.take_over(session, digest, "b", 60, from_state="failed")
        assert not registry.take_over(session, digest, "c", 60, from_state="failed")


def _tree(root: Path, size: int) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_bytes(b"#" * size)
    return root


def _install(cache: EnvironmentCache, tmp_path: Path, digest: str, size: int) -> None:
    source = _tree(tmp_path / f"src-{digest[:4]}", size)
    archive = tmp_path / f"{digest[:4]}.tar.gz"
    pack(source, archive)
    with cache.installing(digest) as present:
        assert not present
        unpacked = cache.scratch(digest)
        unpack(archive, unpacked, 10**9)
        cache.install(digest, unpacked, size)


def test_the_least_recently_used_unpinned_environment_is_evicted(tmp_path: Path) -> None:
    cache = EnvironmentCache(tmp_path / "cache", bound=2500)
    old, pinned, new = ("a" * 64, "b" * 64, "c" * 64)
    _install(cache, tmp_path, pinned, 1000)
    pin = cache.pin_if_present(pinned)
    assert pin is not None
    time.sleep(0.01)
    _install(cache, tmp_path, old, 1000)
    os.utime(cache.tree(pinned), (1, 1))  # (pinned, and used longest ago)
    os.utime(cache.tree(old), (2, 2))
    _install(cache, tmp_path, new, 1000)
    assert not cache.tree(old).exists(), "the least recently used one not pinned goes"
    assert cache.tree(pinned).is_dir() and cache.tree(new).is_dir()
    assert (cache.root.stat().st_mode & 0o777) == 0o700
    pin.release()
    assert cache.evict() == [], "within the bound now"
    assert cache.pin_if_present(old) is None


def test_a_tree_is_linked_into_a_job_read_only(tmp_path: Path) -> None:
    source = _tree(tmp_path / "tree", 10)
    (source / "pkg" / "__init__.py").chmod(0o444)
    os.symlink("pkg", source / "alias")
    (tmp_path / "job").mkdir()
    files = link_tree(source, tmp_path / "job" / "env")
    linked = tmp_path / "job" / "env" / "pkg" / "__init__.py"
    assert files == 1 and linked.stat().st_ino == (source / "pkg" / "__init__.py").stat().st_ino
    assert os.readlink(tmp_path / "job" / "env" / "alias") == "pkg"
    assert (tmp_path / "job" / "env").stat().st_mode & 0o777 == 0o555
    assert (tmp_path / "job" / "env" / "pkg").stat().st_mode & 0o777 == 0o555


def test_the_runtime_appends_the_environment_after_the_workers_packages(tmp_path: Path) -> None:
    import sys

    from ace3.runtime.__main__ import add_environment

    before = list(sys.path)
    try:
        add_environment(str(tmp_path))
        assert sys.path[: len(before)] == before and sys.path[-1] == str(tmp_path)
    finally:
        sys.path[:] = before


def test_a_cancelled_build_gives_its_row_up_to_the_next_builder(
    sessions: sessionmaker[Session],
) -> None:
    identity = _identity()
    digest = identity.hash
    with sessions() as session:
        assert registry.insert_building(session, identity, "a", 60)
        assert not registry.release(session, digest, "b"), "only the builder gives it up"
        assert registry.release(session, digest, "a")
        assert registry.read(session, digest) is None
        assert registry.insert_building(session, identity, "b", 60), "the next one builds"
        assert registry.mark_ready(
            session, digest, "b", storage_key="k", sha256="0" * 64, archive_bytes=1,
            size_bytes=2, packages=(), build_seconds=0.5,
        )  # fmt: skip
        assert not registry.release(session, digest, "b"), "a ready row stays"


def test_a_cancel_stops_the_wait_for_another_workers_build(
    sessions: sessionmaker[Session], tmp_path: Path
) -> None:
    """A job waiting for another worker's build of its environment stops as soon as its
    keep-alive sets the interrupt (the job was cancelled), leaving the build alone."""
    import threading

    from ace3_control.settings import Settings
    from ace3_control.storage import ArtifactStore
    from ace3_worker.environments.prepare import EnvironmentPreparer
    from ace3_worker.environments.uv_commands import PreparationInterrupted
    from ace3_worker.sandbox.plan import SandboxPlan

    identity = _identity()
    with sessions() as session:
        assert registry.insert_building(session, identity, "elsewhere", 600)
    settings = Settings(data_dir=tmp_path)
    plan = SandboxPlan(mode="none", dedicated_uids=False, runtime_paths=(), hidden=())
    store: ArtifactStore = None  # type: ignore[assignment]  # (never reached: it only waits)
    preparer = EnvironmentPreparer(settings, sessions, store, lambda: plan, "here")
    interrupt = threading.Event()
    threading.Timer(0.3, interrupt.set).start()
    lines: list[str] = []
    started = time.monotonic()
    with pytest.raises(PreparationInterrupted):
        preparer._obtain(identity, lines.append, interrupt)
    assert time.monotonic() - started < 3
    assert any("waiting for its build by elsewhere" in line for line in lines), lines
    with sessions() as session:
        view = registry.read(session, identity.hash)
        assert view is not None and (view.state, view.builder) == ("building", "elsewhere")
