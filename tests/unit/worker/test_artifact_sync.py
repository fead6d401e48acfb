"""The worker's artifact sync: new and changed files become versions in the store, unchanged
ones cost nothing, links and temporary files are never read, the size cap holds, a stale attempt
writes nothing, and a re-queued attempt starts with the files where they were."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from ace3_control.models import Job, JobArtifact
from ace3_control.settings import Settings
from ace3_control.storage import LocalArtifactStore
from ace3_server.migrations_check import upgrade
from ace3_worker.artifact_sync import ArtifactSync, artifact_key
from ace3_worker.supervisor import Supervisor
from tests.conftest import insert_job


@pytest.fixture()
def supervisor(tmp_path: Path) -> Supervisor:
    (tmp_path / "data").mkdir()
    settings = Settings(data_dir=tmp_path / "data")
    upgrade(settings.resolved_database_url)
    return Supervisor(settings)


@pytest.fixture()
def job(supervisor: Supervisor) -> Job:
    with supervisor.sessions() as session:
        return insert_job(session, attempt=1, state="running")


def _sync(
    supervisor: Supervisor, job: Job, root: Path, *, attempt: int = 1, cap: int = 1 << 30
) -> ArtifactSync:
    root.mkdir(parents=True, exist_ok=True)
    return ArtifactSync(job.id, attempt, root, supervisor.store, cap)


def _rows(sessions: Callable[[], Session], job_id: str) -> dict[str, JobArtifact]:
    with sessions() as session:
        rows = session.scalars(select(JobArtifact).where(JobArtifact.job_id == job_id))
        return {row.path: row for row in rows}


def _stored(store: LocalArtifactStore, row: JobArtifact) -> bytes:
    return store.open(row.storage_key).read()


def _bump_mtime(path: Path) -> None:
    """Make a rewrite visible even within the filesystem's timestamp granularity."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))


def test_new_files_are_stored_under_the_job_and_their_hash(
    supervisor: Supervisor, job: Job, tmp_path: Path
) -> None:
    root = tmp_path / "artifacts"
    sync = _sync(supervisor, job, root)
    (root / "tensorboard" / "run").mkdir(parents=True)
    (root / "tensorboard" / "run" / "events.out").write_bytes(b"event-1")
    (root / "trace.json").write_text("{}")

    assert sorted(sync.sync(supervisor.sessions)) == ["tensorboard/run/events.out", "trace.json"]

    rows = _rows(supervisor.sessions, job.id)
    events = rows["tensorboard/run/events.out"]
    digest = hashlib.sha256(b"event-1").hexdigest()
    assert (events.sha256, events.size_bytes, events.version, events.attempt) == (digest, 7, 1, 1)
    assert events.storage_key == artifact_key(job.id, digest) and job.id in events.storage_key
    assert _stored(supervisor.store, events) == b"event-1"
    assert sync.sync(supervisor.sessions) == [], "nothing changed: nothing is synced again"


def test_a_changed_file_is_a_new_version_and_its_old_bytes_are_deleted(
    supervisor: Supervisor, job: Job, tmp_path: Path
) -> None:
    root = tmp_path / "artifacts"
    sync = _sync(supervisor, job, root)
    log = root / "log.csv"
    log.write_text("step,loss\n1,0.9\n")  # synced mid-write ...
    sync.sync(supervisor.sessions)
    first = _rows(supervisor.sessions, job.id)["log.csv"]

    with log.open("a") as handle:  # ... and again once complete
        handle.write("2,0.5\n")
    _bump_mtime(log)
    assert sync.sync(supervisor.sessions) == ["log.csv"]

    second = _rows(supervisor.sessions, job.id)["log.csv"]
    assert second.version == 2 and second.id == first.id
    assert _stored(supervisor.store, second) == b"step,loss\n1,0.9\n2,0.5\n"
    assert not supervisor.store.exists(first.storage_key), "the replaced version's bytes are gone"


def test_a_touched_file_with_the_same_bytes_is_no_new_version(
    supervisor: Supervisor, job: Job, tmp_path: Path
) -> None:
    root = tmp_path / "artifacts"
    sync = _sync(supervisor, job, root)
    (root / "model.pt").write_bytes(b"weights")
    sync.sync(supervisor.sessions)
    _bump_mtime(root / "model.pt")
    assert sync.sync(supervisor.sessions) == []
    assert _rows(supervisor.sessions, job.id)["model.pt"].version == 1


def test_links_special_files_and_temporary_files_are_never_synced(
    supervisor: Supervisor, job: Job, tmp_path: Path
) -> None:
    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("not the job's")
    root = tmp_path / "artifacts"
    sync = _sync(supervisor, job, root)
    (root / "leak.txt").symlink_to(secret)
    (root / "leaked_dir").symlink_to(secret.parent, target_is_directory=True)
    os.mkfifo(root / "pipe")
    (root / ".model.pt.tmp-123").write_bytes(b"half")
    (root / ".huggingface.tmp-7").mkdir()  # a directory written whole, then renamed
    (root / ".huggingface.tmp-7" / "config.json").write_text("{}")
    (root / "real.txt").write_text("mine")

    assert sync.sync(supervisor.sessions) == ["real.txt"]
    assert set(_rows(supervisor.sessions, job.id)) == {"real.txt"}


def test_an_artifacts_directory_replaced_by_a_link_is_not_followed(
    supervisor: Supervisor, job: Job, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("not the job's")
    root = tmp_path / "output" / "artifacts"
    root.parent.mkdir()
    root.symlink_to(outside, target_is_directory=True)
    sync = ArtifactSync(job.id, 1, root, supervisor.store, 1 << 30)
    assert sync.sync(supervisor.sessions) == []
    assert _rows(supervisor.sessions, job.id) == {}
    assert any("replaced by a link" in notice for notice in sync.take_notices())


def test_files_past_the_size_cap_are_not_synced_and_the_job_log_says_so_once(
    supervisor: Supervisor, job: Job, tmp_path: Path
) -> None:
    root = tmp_path / "artifacts"
    sync = _sync(supervisor, job, root, cap=100)
    (root / "a.bin").write_bytes(b"a" * 60)
    (root / "b.bin").write_bytes(b"b" * 60)

    assert sync.sync(supervisor.sessions) == ["a.bin"]
    notices = sync.take_notices()
    assert len(notices) == 1 and "b.bin" in notices[0]
    assert "ACE3_MAX_ARTIFACT_BYTES=100" in notices[0]
    assert sync.sync(supervisor.sessions) == [] and sync.take_notices() == [], "said once"
    assert set(_rows(supervisor.sessions, job.id)) == {"a.bin"}

    (root / "a.bin").unlink()  # room again: b.bin is synced on the next pass
    assert sync.sync(supervisor.sessions) == ["b.bin"]
    assert set(_rows(supervisor.sessions, job.id)) == {"b.bin"}


def test_a_file_that_grows_past_the_cap_while_it_is_copied_is_never_stored(
    supervisor: Supervisor, job: Job, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy stops at the room left: neither the staging disk nor the store takes more."""
    root = tmp_path / "artifacts"
    sync = _sync(supervisor, job, root, cap=100)
    (root / "log.txt").write_bytes(b"x" * 10)
    stage = sync._stage
    offered: list[int] = []

    def grow_then_stage(path: str, max_bytes: int) -> object:
        with (root / path).open("ab") as handle:  # (the job appends after the scan)
            handle.write(b"y" * 10_000)
        original = supervisor.store.put_hashed

        def counting(source: object, key_for: object, *, max_bytes: int | None = None) -> object:
            offered.append(-1 if max_bytes is None else max_bytes)
            return original(source, key_for, max_bytes=max_bytes)  # type: ignore[arg-type]

        monkeypatch.setattr(supervisor.store, "put_hashed", counting)
        return stage(path, max_bytes)

    monkeypatch.setattr(sync, "_stage", grow_then_stage)
    assert sync.sync(supervisor.sessions) == []
    assert offered == [100], "the copy was capped at the room left"
    notices = sync.take_notices()
    assert len(notices) == 1 and "more than 100 bytes" in notices[0]
    assert _rows(supervisor.sessions, job.id) == {}
    stored = [p for p in supervisor.settings.resolved_storage_dir.rglob("*") if p.is_file()]
    assert not [p for p in stored if "artifacts" in p.as_posix()], "nothing stored"


def test_a_deleted_file_loses_its_row_but_shared_bytes_stay_while_named(
    supervisor: Supervisor, job: Job, tmp_path: Path
) -> None:
    root = tmp_path / "artifacts"
    sync = _sync(supervisor, job, root)
    (root / "one.txt").write_text("same bytes")
    (root / "two.txt").write_text("same bytes")
    sync.sync(supervisor.sessions)
    rows = _rows(supervisor.sessions, job.id)
    assert rows["one.txt"].storage_key == rows["two.txt"].storage_key, "stored once"

    (root / "one.txt").unlink()
    sync.sync(supervisor.sessions)
    rows = _rows(supervisor.sessions, job.id)
    assert set(rows) == {"two.txt"} and _stored(supervisor.store, rows["two.txt"]) == b"same bytes"

    (root / "two.txt").unlink()
    sync.sync(supervisor.sessions)
    assert _rows(supervisor.sessions, job.id) == {}
    assert not list((supervisor.store.root / "job-artifacts" / job.id).iterdir())


def test_an_attempt_that_no_longer_owns_the_job_records_nothing(
    supervisor: Supervisor, job: Job, tmp_path: Path
) -> None:
    root = tmp_path / "artifacts"
    sync = _sync(supervisor, job, root)
    with supervisor.sessions() as session:  # re-queued and claimed again: attempt 2 owns it
        session.execute(update(Job).where(Job.id == job.id).values(attempt=2))
        session.commit()
    (root / "late.txt").write_text("from a stale attempt")
    assert sync.sync(supervisor.sessions) == []
    assert sync.fenced_out and _rows(supervisor.sessions, job.id) == {}


def test_a_requeued_attempt_starts_with_the_jobs_artifacts_and_continues_them(
    supervisor: Supervisor, job: Job, tmp_path: Path
) -> None:
    first_root = tmp_path / "attempt-1" / "artifacts"
    first = _sync(supervisor, job, first_root)
    (first_root / "logs").mkdir()
    (first_root / "logs" / "history.csv").write_text("1\n")
    first.sync(supervisor.sessions)
    with supervisor.sessions() as session:
        session.execute(update(Job).where(Job.id == job.id).values(attempt=2))
        session.commit()

    second_root = tmp_path / "attempt-2" / "artifacts"
    second = _sync(supervisor, job, second_root, attempt=2)
    with supervisor.sessions() as session:
        second.load(session)
    assert second.restore() == 1
    restored = second_root / "logs" / "history.csv"
    assert restored.read_text() == "1\n" and not restored.is_symlink()
    assert second.sync(supervisor.sessions) == [], "restored files are not synced again"

    with restored.open("a") as handle:
        handle.write("2\n")
    _bump_mtime(restored)
    assert second.sync(supervisor.sessions) == ["logs/history.csv"]
    row = _rows(supervisor.sessions, job.id)["logs/history.csv"]
    assert (row.version, row.attempt) == (2, 2)
    assert _stored(supervisor.store, row) == b"1\n2\n"


def test_the_store_keeps_exactly_the_bytes_it_hashed(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path / "store")
    source = tmp_path / "growing.bin"
    source.write_bytes(b"x" * 3_000_000)
    with source.open("rb") as handle:
        blob = store.put_hashed(handle, lambda sha: f"blobs/{sha}")
    assert blob.size_bytes == 3_000_000
    assert blob.sha256 == hashlib.sha256(b"x" * 3_000_000).hexdigest()
    assert store.open(blob.key).read() == b"x" * 3_000_000
    with source.open("rb") as handle:  # the same bytes again: the stored file is kept
        again = store.put_hashed(handle, lambda sha: f"blobs/{sha}")
    assert again == blob
    assert list(store.staging_dir().iterdir()) == []


def test_a_directory_of_too_many_files_is_synced_only_up_to_the_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ace3_worker import artifact_sync

    monkeypatch.setattr(artifact_sync, "MAX_ENTRIES", 5)
    root = tmp_path / "artifacts"
    root.mkdir()
    for index in range(20):
        (root / f"f{index}").write_text("x")
    sync = ArtifactSync("job", 1, root, LocalArtifactStore(tmp_path / "store"), 1 << 20)
    assert sync.scan() == {}, "nothing past the cap is even looked at"
    assert any("more than 5 files and directories" in notice for notice in sync.take_notices())
