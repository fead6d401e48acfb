"""Syncs the files a job writes under ``output/artifacts/`` into the artifact store, as it runs.

Every pass (each ``ACE3_ARTIFACT_SYNC_SECONDS`` while the job runs, and once more after torchrun
exits) walks the directory without following links. A regular file that is new, or whose size or
modification time changed since it was last synced, is copied into the store while it is hashed
(the stored bytes are exactly the hashed ones, even when the file is being written meanwhile; the
next pass then sees it changed and syncs it again), under ``job-artifacts/<job id>/<sha256>``.
Its ``job_artifacts`` row is inserted, or moved to the new bytes with ``version + 1``; the same
bytes again make no new version. A file deleted from the directory loses its row. Bytes that no
row of the job names any more are deleted from the store. Rows are written only while the attempt
still owns the job (``job_transitions.hold_attempt`` in the same transaction).

Skipped: symbolic links, files with other hard links and anything else that is not a regular
file (every file is opened one path component at a time without following a link, so nothing
outside the directory is ever read, even when the job swaps a directory for a link meanwhile),
hidden temporary files of atomic writes (``.<name>.tmp...``), and names that are not UTF-8,
hold control characters or are longer than 1024 characters; a directory holding more than
``MAX_ENTRIES`` files and directories is synced only up to that many. All the job's
artifacts together may hold ``ACE3_MAX_ARTIFACT_BYTES``: a file that would pass that cap is not
synced (the worker's log and the job's log say so, once per file) until it fits.

A re-queued attempt starts in a fresh directory: :meth:`ArtifactSync.restore` first copies the
job's recorded artifacts back into it, so the attempt continues the files where they were.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from ace3_control import job_transitions
from ace3_control.models import JobArtifact, utcnow
from ace3_control.storage import ArtifactStore, StoredBlob, StoredTooLargeError
from ace3_worker.job_files import UnsafeJobPathError, open_job_file

logger = logging.getLogger(__name__)

MAX_PATH_CHARS = 1024
MAX_ENTRIES = 10_000  # files and directories under one job's artifacts directory


def artifact_key(job_id: str, sha256: str) -> str:
    """Where an artifact's bytes live in the store: per job, by content."""
    return f"job-artifacts/{job_id}/{sha256}"


def is_temporary(name: str) -> bool:
    """A hidden temporary file or directory of an atomic write (``.model.pt.tmp-123``): renamed
    soon."""
    return name.startswith(".") and ".tmp" in name


def path_problem(relative: str) -> str | None:
    """Why ``relative`` cannot be an artifact path, or None."""
    try:
        relative.encode("utf-8")
    except UnicodeEncodeError:
        return "its name is not valid UTF-8"
    if len(relative) > MAX_PATH_CHARS:
        return f"its path is longer than {MAX_PATH_CHARS} characters"
    if any(ord(char) < 32 or ord(char) == 127 for char in relative):
        return "its name holds a control character"
    return None


@dataclass(frozen=True)
class FileState:
    """What says a file changed: its size and modification time (nanoseconds)."""

    size_bytes: int
    mtime_ns: int

    @classmethod
    def of(cls, result: os.stat_result) -> FileState:
        return cls(result.st_size, result.st_mtime_ns)


@dataclass(frozen=True)
class RecordedArtifact:
    sha256: str
    size_bytes: int
    storage_key: str


@dataclass(frozen=True)
class _Staged:
    path: str
    state: FileState
    blob: StoredBlob


@dataclass
class ArtifactSync:
    """The artifacts directory of one attempt and what of it is recorded.

    Single-threaded: the supervisor calls :meth:`sync` from its watch loop. ``notices`` collects
    messages for the job's own log (the supervisor drains them).
    """

    job_id: str
    attempt: int
    root: Path
    store: ArtifactStore
    max_total_bytes: int
    recorded: dict[str, RecordedArtifact] = field(default_factory=dict)
    synced_state: dict[str, FileState] = field(default_factory=dict)
    notices: list[str] = field(default_factory=list)
    fenced_out: bool = False
    _reported: set[tuple[str, str]] = field(default_factory=set)

    @property
    def total_bytes(self) -> int:
        return sum(item.size_bytes for item in self.recorded.values())

    # -- start of an attempt --------------------------------------------------------------------
    def load(self, session: Session) -> None:
        """Read what earlier attempts of the job recorded."""
        rows = session.scalars(select(JobArtifact).where(JobArtifact.job_id == self.job_id))
        self.recorded = {
            row.path: RecordedArtifact(row.sha256, row.size_bytes, row.storage_key) for row in rows
        }

    def restore(self) -> int:
        """Copy the recorded artifacts into the (new, empty) directory; return how many.

        Copies, not links: the job may append to or rewrite them. A file that cannot be restored
        keeps its row and is left alone by later passes unless the job writes it again.
        """
        restored = 0
        for relative, item in sorted(self.recorded.items()):
            target = self.root / relative
            try:
                if path_problem(relative) or ".." in relative.split("/"):
                    raise ValueError(f"unsafe path {relative!r}")
                target.parent.mkdir(parents=True, exist_ok=True)
                with self.store.open(item.storage_key) as source, target.open("xb") as copy:
                    shutil.copyfileobj(source, copy)
                self.synced_state[relative] = FileState.of(target.stat())
                restored += 1
            except (OSError, ValueError) as exc:
                logger.warning(
                    "job %s: could not restore artifact %s: %s", self.job_id, relative, exc
                )
        return restored

    # -- a pass ---------------------------------------------------------------------------------
    def scan(self) -> dict[str, FileState]:
        """Every regular file under the directory (links are neither followed nor listed)."""
        found: dict[str, FileState] = {}
        if self.root.is_symlink() or not self.root.is_dir():
            if self.root.is_symlink():
                self._report_once("", "link", "the artifacts directory was replaced by a link")
            return found
        seen = 0
        for directory, subdirectories, names in os.walk(self.root, followlinks=False):
            # (a directory being written whole, then renamed into place: .huggingface.tmp-12)
            subdirectories[:] = [name for name in subdirectories if not is_temporary(name)]
            seen += len(names) + len(subdirectories)
            if seen > MAX_ENTRIES:  # (a walk costs the worker time on every pass)
                self._report_once(
                    "",
                    "entries",
                    f"more than {MAX_ENTRIES} files and directories: the rest is not synced",
                )
                break
            for name in names:
                if is_temporary(name):
                    continue
                full = Path(directory) / name
                relative = full.relative_to(self.root).as_posix()
                problem = path_problem(relative)
                if problem is not None:
                    self._report_once(relative, "name", f"{problem}: not synced")
                    continue
                try:
                    result = os.lstat(full)
                except OSError:
                    continue  # gone since the listing
                if stat.S_ISREG(result.st_mode):
                    found[relative] = FileState.of(result)
        return found

    def sync(self, sessions: Callable[[], Session]) -> list[str]:
        """One pass: record new and changed files, forget deleted ones; return the paths whose
        new bytes were recorded. Database errors propagate (the pass is retried later)."""
        if self.fenced_out:
            return []
        on_disk = self.scan()
        vanished = [path for path in self.synced_state if path not in on_disk]
        changed = sorted(
            path for path, state in on_disk.items() if self.synced_state.get(path) != state
        )
        total = self.total_bytes - sum(
            self.recorded[path].size_bytes for path in vanished if path in self.recorded
        )
        accepted: list[_Staged] = []
        for path in changed:
            previous = self.recorded.get(path)
            room = self.max_total_bytes - total + (previous.size_bytes if previous else 0)
            if on_disk[path].size_bytes > room:
                self._refuse_for_cap(path, f"{on_disk[path].size_bytes} bytes")
                continue
            try:
                staged = self._stage(path, room)
            except StoredTooLargeError:  # it grew while it was copied: nothing was stored
                self._refuse_for_cap(path, f"more than {room} bytes")
                continue
            if staged is None:
                continue
            if previous is not None and previous.sha256 == staged.blob.sha256:
                self.synced_state[path] = staged.state  # touched, same bytes: no new version
                continue
            total += staged.blob.size_bytes - (previous.size_bytes if previous else 0)
            accepted.append(staged)
        if not accepted and not vanished:
            return []
        unreferenced = self._record(sessions, accepted, vanished)
        if unreferenced is None:
            return []
        for key in unreferenced:
            self.store.delete(key)
        for path in vanished:
            self.recorded.pop(path, None)
            self.synced_state.pop(path, None)
        for staged in accepted:
            blob = staged.blob
            self.recorded[staged.path] = RecordedArtifact(blob.sha256, blob.size_bytes, blob.key)
            self.synced_state[staged.path] = staged.state
            self._reported = {item for item in self._reported if item[0] != staged.path}
        return [staged.path for staged in accepted]

    def take_notices(self) -> list[str]:
        notices, self.notices = self.notices, []
        return notices

    # -- pieces ---------------------------------------------------------------------------------
    def _stage(self, path: str, max_bytes: int) -> _Staged | None:
        """Copy the file into the store (hashing it); None when it cannot be read right now.
        Past ``max_bytes`` (a file the job keeps writing) the copy stops and nothing is stored
        (StoredTooLargeError): the staging disk and the store never take more than the cap."""
        try:  # (component by component, no links: the job may swap a directory for one)
            fd = open_job_file(self.root, path)
        except UnsafeJobPathError as exc:
            self._report_once(path, "read", f"is not a plain file ({exc.strerror}): not synced")
            return None
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                self._report_once(path, "read", f"cannot be read ({exc.strerror}): not synced")
            return None
        with os.fdopen(fd, "rb") as handle:
            opened = os.fstat(handle.fileno())
            try:
                blob = self.store.put_hashed(
                    handle, lambda sha: artifact_key(self.job_id, sha), max_bytes=max_bytes
                )
            except OSError as exc:
                self._report_once(path, "copy", f"cannot be copied ({exc.strerror}): not synced")
                return None
        # The state from before the copy: a write during the copy shows as a change next pass.
        return _Staged(path, FileState.of(opened), blob)

    def _record(
        self, sessions: Callable[[], Session], accepted: list[_Staged], vanished: list[str]
    ) -> set[str] | None:
        """Write the rows (fenced); return the storage keys no row names any more, or None
        when another attempt owns the job."""
        with sessions() as session:
            held = session.execute(job_transitions.hold_attempt(self.job_id, self.attempt))
            if held.first() is None:
                session.rollback()
                self.fenced_out = True
                logger.warning(
                    "job %s attempt %d no longer owns the job: its artifacts are not synced",
                    self.job_id,
                    self.attempt,
                )
                return None
            rows = {
                row.path: row
                for row in session.scalars(
                    select(JobArtifact).where(JobArtifact.job_id == self.job_id)
                )
            }
            replaced: set[str] = set()
            now = utcnow()
            for path in vanished:
                row = rows.pop(path, None)
                if row is not None:
                    replaced.add(row.storage_key)
                    session.delete(row)
            for staged in accepted:
                blob, row = staged.blob, rows.get(staged.path)
                if row is None:
                    session.add(
                        JobArtifact(
                            job_id=self.job_id,
                            path=staged.path,
                            attempt=self.attempt,
                            version=1,
                            size_bytes=blob.size_bytes,
                            sha256=blob.sha256,
                            storage_key=blob.key,
                            created_at=now,
                            updated_at=now,
                        )
                    )
                elif row.sha256 != blob.sha256:
                    replaced.add(row.storage_key)
                    row.version += 1
                    row.attempt = self.attempt
                    row.size_bytes = blob.size_bytes
                    row.sha256 = blob.sha256
                    row.storage_key = blob.key
                    row.updated_at = now
            session.flush()
            still_named = (
                set(
                    session.scalars(
                        select(JobArtifact.storage_key).where(
                            JobArtifact.job_id == self.job_id,
                            JobArtifact.storage_key.in_(replaced),
                        )
                    )
                )
                if replaced
                else set()
            )
            session.commit()
        return replaced - still_named

    def _refuse_for_cap(self, path: str, size: str) -> None:
        self._report_once(
            path,
            "cap",
            f"({size}) not synced: the job's artifacts would pass "
            f"ACE3_MAX_ARTIFACT_BYTES={self.max_total_bytes} bytes (now {self.total_bytes} "
            "bytes stored); write less, or ask the operator to raise the cap",
        )

    def _report_once(self, path: str, kind: str, message: str) -> None:
        """Log (and tell the job's log) once per file and kind of problem."""
        if (path, kind) in self._reported:
            return
        self._reported.add((path, kind))
        text = f"artifact {path} {message}" if path else f"artifacts: {message}"
        logger.warning("job %s: %s", self.job_id, text)
        self.notices.append(f"ace3: {text}")
