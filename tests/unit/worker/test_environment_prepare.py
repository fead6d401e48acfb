"""How a worker obtains an environment when builds race, fail or die (issue 28's review): a
builder that lost its lease never changes the archive the row names; a stored archive that
does not match its row or cannot be unpacked is built again; a refusal fails the row while a
failure that may pass gives it up (retried); a waiter waits as long as the builder's lease is
live and builds itself when the row goes; a local wait for another process's install stops on
the attempt's interrupt; builds run in locked scratch directories of the work filesystem, and
what a killed worker left is swept. The build itself is a stand-in (no uv): these are the
cluster's and the cache's rules."""

from __future__ import annotations

import fcntl
import os
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from ace3.files import sha256_file
from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.models import EnvironmentState
from ace3_control.settings import Settings
from ace3_control.storage.local import LocalArtifactStore
from ace3_server.migrations_check import upgrade
from ace3_worker.environments import prepare as prepare_module
from ace3_worker.environments import registry
from ace3_worker.environments.build import BuiltTree, EnvironmentBuilder, take_ownership
from ace3_worker.environments.identity import EnvironmentIdentity, environment_identity
from ace3_worker.environments.prepare import EnvironmentPreparer
from ace3_worker.environments.uv_commands import (
    EnvironmentBuildError,
    EnvironmentRefusedError,
    Pin,
    PreparationInterrupted,
)
from ace3_worker.sandbox.plan import SandboxPlan

PLAN = SandboxPlan(mode="none", dedicated_uids=False, runtime_paths=(), hidden=())


@pytest.fixture
def sessions(tmp_path: Path) -> sessionmaker[Session]:
    url = f"sqlite:///{tmp_path / 'ace3.db'}"
    upgrade(url)
    return sync_session_factory(make_sync_engine(url))


@pytest.fixture
def store(tmp_path: Path) -> LocalArtifactStore:
    return LocalArtifactStore(tmp_path / "store")


Build = Callable[[str, Path], None]


@pytest.fixture
def fake_build(monkeypatch: pytest.MonkeyPatch) -> dict[str, Build]:
    """EnvironmentBuilder.build without uv: a one-package tree; ``hooks[name]`` runs first in
    the build of the worker named ``name`` (the thread's name)."""
    hooks: dict[str, Build] = {}

    def build(self: EnvironmentBuilder, requirements: Sequence[str], scratch: Path) -> BuiltTree:
        name = threading.current_thread().name
        if name in hooks:
            hooks[name](name, scratch)
        target = scratch / "work" / "target"
        (target / "pkg").mkdir(parents=True)
        (target / "pkg" / "__init__.py").write_text(f"BY = {name!r}\n")
        time.sleep(1.05)  # (a later second: two builds' archives differ, as real ones do)
        take_ownership(target)
        return BuiltTree(target, (Pin("pkg", "1.0"),), 20, 0.1)

    monkeypatch.setattr(EnvironmentBuilder, "build", build)
    return hooks


def _identity() -> EnvironmentIdentity:
    return environment_identity([f"pkg-{secrets.token_hex(4)}"], installed={"torch": "2.13.0"})


def _preparer(
    tmp_path: Path, sessions: sessionmaker[Session], store: LocalArtifactStore, name: str,
    **settings: Any,
) -> EnvironmentPreparer:  # fmt: skip
    values: dict[str, Any] = {"data_dir": tmp_path / name, "lease_seconds": 30}
    values.update(settings)
    return EnvironmentPreparer(Settings(**values), sessions, store, lambda: PLAN, name)


def _obtain(preparer: EnvironmentPreparer, identity: EnvironmentIdentity) -> tuple[str, list[str]]:
    """Obtain as the worker would (under the installing lock), in a thread named after it."""
    result: dict[str, Any] = {}
    lines: list[str] = []

    def run() -> None:
        try:
            with preparer.cache.installing(identity.hash) as present:
                assert not present
                result["how"] = preparer._obtain(identity, lines.append, threading.Event())
        except BaseException as exc:  # (handed to the test)
            result["error"] = exc

    thread = threading.Thread(target=run, name=preparer.builder_id)
    thread.start()
    thread.join(timeout=60)
    if "error" in result:
        raise result["error"]
    return result["how"], lines


def _row(sessions: sessionmaker[Session], identity: EnvironmentIdentity) -> registry.RowView:
    with sessions() as session:
        row = registry.read(session, identity.hash)
    assert row is not None
    return row


def _expire(sessions: sessionmaker[Session], identity: EnvironmentIdentity) -> None:
    """The builder's lease ends now (as if it had stopped renewing)."""
    from datetime import timedelta

    from sqlalchemy import update

    from ace3_control.models import Environment, utcnow

    with sessions() as session:
        session.execute(
            update(Environment)
            .where(Environment.hash == identity.hash)
            .values(lease_expires_at=utcnow() - timedelta(seconds=1))
        )
        session.commit()


@pytest.mark.parametrize("lost_at", ["before the upload", "during the upload"])
def test_a_builder_that_lost_its_lease_leaves_the_rows_archive_alone(
    tmp_path: Path,
    sessions: sessionmaker[Session],
    store: LocalArtifactStore,
    fake_build: dict[str, Build],
    monkeypatch: pytest.MonkeyPatch,
    lost_at: str,
) -> None:
    """A's lease expires mid-build (its renewals fail) and B takes the build over and stores
    the environment; A finishing late neither overwrites B's archive nor changes the row, and
    uses its own tree; the next worker fetches B's archive (before the fix A's late upload
    replaced it, and every fetch then failed on the sha256, forever)."""
    identity = _identity()
    late = _preparer(tmp_path, sessions, store, "A")
    other = _preparer(tmp_path, sessions, store, "B")
    lost = threading.Event()
    renew = registry.renew
    monkeypatch.setattr(
        registry,
        "renew",
        lambda s, h, b, seconds: False if b == "A" and lost.is_set() else renew(s, h, b, seconds),
    )
    lines: list[str] = []

    def taken_over() -> None:
        lost.set()
        _expire(sessions, identity)
        how, said = _obtain(other, identity)
        assert how == "built", said
        assert any("stopped renewing" in line for line in said), said

    if lost_at == "before the upload":
        fake_build["A"] = lambda name, scratch: taken_over()
    else:
        put = store.put_file

        def put_late(key: str, source: Path) -> None:
            if threading.current_thread().name == "A":
                taken_over()
            put(key, source)

        monkeypatch.setattr(store, "put_file", put_late)
    with sessions() as session:
        assert registry.insert_building(session, identity, "A", 30)
    outcome: dict[str, Any] = {}

    def build_as_a() -> None:
        with late.cache.installing(identity.hash) as present:
            assert not present
            outcome["how"] = late._build(identity, lines.append, threading.Event())

    thread = threading.Thread(target=build_as_a, name="A")
    thread.start()
    thread.join(timeout=60)
    how = outcome.get("how")
    assert how == "built" and late.cache.tree(identity.hash).is_dir(), "A keeps its own tree"
    assert any("another worker took its build over" in line for line in lines), lines
    row = _row(sessions, identity)
    assert row.state == EnvironmentState.READY
    assert row.storage_key == f"environments/{identity.hash}/{row.sha256}.tar.gz"
    assert sha256_file(store._path(row.storage_key)) == row.sha256, "the row's archive is B's"
    assert store.list(f"environments/{identity.hash}/") == [row.storage_key], "A's is deleted"
    fetched = _obtain(_preparer(tmp_path, sessions, store, "C"), identity)
    assert fetched[0] == "fetched", fetched


@pytest.mark.parametrize("damage", ["other bytes", "truncated", "missing"])
def test_an_archive_that_does_not_match_its_row_is_built_again(
    tmp_path: Path,
    sessions: sessionmaker[Session],
    store: LocalArtifactStore,
    fake_build: dict[str, Build],
    damage: str,
) -> None:
    identity = _identity()
    assert _obtain(_preparer(tmp_path, sessions, store, "A"), identity)[0] == "built"
    row = _row(sessions, identity)
    assert row.storage_key is not None
    path = store._path(row.storage_key)
    if damage == "other bytes":
        path.write_bytes(b"not the archive")
    elif damage == "truncated":  # (the right sha256 recorded for bytes that cannot unpack)
        data = path.read_bytes()[:100]
        path.unlink()
        broken = tmp_path / "broken.tar.gz"
        broken.write_bytes(data)
        from ace3_control.models import Environment

        with sessions() as session:
            env = session.get(Environment, identity.hash)
            assert env is not None
            env.sha256 = sha256_file(broken)
            env.storage_key = f"environments/{identity.hash}/{env.sha256}.tar.gz"
            session.commit()
        store.put_file(f"environments/{identity.hash}/{sha256_file(broken)}.tar.gz", broken)
    else:
        path.unlink()
    how, lines = _obtain(_preparer(tmp_path, sessions, store, "B"), identity)
    assert how == "built", lines
    assert any("cannot be used" in line for line in lines), lines
    rebuilt = _row(sessions, identity)
    assert rebuilt.state == EnvironmentState.READY and rebuilt.sha256 != row.sha256
    assert rebuilt.storage_key is not None
    assert sha256_file(store._path(rebuilt.storage_key)) == rebuilt.sha256
    assert _obtain(_preparer(tmp_path, sessions, store, "C"), identity)[0] == "fetched"


def test_a_refusal_fails_the_row_and_a_passing_failure_gives_it_up(
    tmp_path: Path,
    sessions: sessionmaker[Session],
    store: LocalArtifactStore,
    fake_build: dict[str, Build],
) -> None:
    def refused(name: str, scratch: Path) -> None:
        raise EnvironmentRefusedError("no wheel for pkg")

    def disk_full(name: str, scratch: Path) -> None:
        raise OSError(28, "No space left on device")

    def stopping(name: str, scratch: Path) -> None:
        raise KeyboardInterrupt

    fake_build["A"] = refused
    identity = _identity()
    with pytest.raises(EnvironmentRefusedError, match="no wheel"):
        _obtain(_preparer(tmp_path, sessions, store, "A"), identity)
    assert _row(sessions, identity).state == EnvironmentState.FAILED

    for name, hook, raised in (("B", disk_full, EnvironmentBuildError),
                               ("C", stopping, KeyboardInterrupt)):  # fmt: skip
        fake_build[name] = hook
        identity = _identity()
        with pytest.raises(raised) as caught:
            _obtain(_preparer(tmp_path, sessions, store, name), identity)
        if raised is EnvironmentBuildError:
            assert "No space left" in str(caught.value)
        with sessions() as session:
            assert registry.read(session, identity.hash) is None, "given up: the next builds"
    assert not any((tmp_path / "B" / "jobs" / ".env-builds").iterdir()), "scratch removed"


def test_a_waiter_waits_while_the_lease_lives_and_builds_when_the_row_goes(
    tmp_path: Path,
    sessions: sessionmaker[Session],
    store: LocalArtifactStore,
    fake_build: dict[str, Build],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """B waits for A's build longer than the build timeout and two leases (no deadline of its
    own while A renews), and when A's build fails for a reason that may pass (the row given
    up), B builds it instead of failing."""
    monkeypatch.setattr(prepare_module, "WAIT_SLACK_SECONDS", 0.0, raising=False)
    fast = {"lease_seconds": 0.6, "heartbeat_seconds": 0.1, "env_build_timeout_seconds": 0.1}

    def slow_then_broken(name: str, scratch: Path) -> None:
        time.sleep(2.5)  # (past 0.1 s + 2 x 0.6 s: A renews its lease meanwhile)
        raise OSError("the index went away")

    fake_build["A"] = slow_then_broken
    identity = _identity()
    errors: list[BaseException] = []

    def builder() -> None:
        try:
            _obtain(_preparer(tmp_path, sessions, store, "A", **fast), identity)
        except BaseException as exc:
            errors.append(exc)

    first = threading.Thread(target=builder)
    first.start()
    while True:
        with sessions() as session:
            if registry.read(session, identity.hash) is not None:
                break
        time.sleep(0.01)
    how, lines = _obtain(_preparer(tmp_path, sessions, store, "B", **fast), identity)
    first.join()
    assert how == "built", lines
    assert any("waiting for its build by A" in line for line in lines), lines
    assert [type(error) for error in errors] == [EnvironmentBuildError]
    assert _row(sessions, identity).state == EnvironmentState.READY


def test_a_local_wait_for_another_processs_install_stops_on_the_interrupt(
    tmp_path: Path, sessions: sessionmaker[Session], store: LocalArtifactStore
) -> None:
    preparer = _preparer(tmp_path, sessions, store, "A")
    identity = environment_identity(["einops"], installed={"torch": "2.13.0"})
    preparer.cache._ready_root()
    other = os.open(preparer.cache._lock_path(identity.hash), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(other, fcntl.LOCK_EX)  # (another process installs it)
    interrupt = threading.Event()
    threading.Timer(0.3, interrupt.set).start()
    started = time.monotonic()
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            with preparer.cache.installing(identity.hash, interrupt):
                outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=5)
    os.close(other)
    assert outcome and isinstance(outcome[0], PreparationInterrupted), outcome
    assert time.monotonic() - started < 3
    with pytest.raises(PreparationInterrupted):
        preparer.cache.pin_if_present(identity.hash, _locked_then_set(preparer, identity))


def _locked_then_set(preparer: EnvironmentPreparer, identity: EnvironmentIdentity) -> Any:
    """An interrupt set soon, while another fd holds the entry's lock exclusively."""
    fd = os.open(preparer.cache._lock_path(identity.hash), os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    interrupt = threading.Event()

    def later() -> None:
        interrupt.set()
        time.sleep(0.5)
        os.close(fd)

    threading.Timer(0.2, later).start()
    return interrupt
