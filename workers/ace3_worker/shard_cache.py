"""The node-wide cache of dataset shards (``ACE3_DATASET_CACHE_DIR``), bounded by
``ACE3_DATASET_CACHE_BYTES``, shared by every worker process and every job of this node.

Layout: ``<cache>/<manifest digest>/<file>`` (the shard's file name in a job,
:func:`ace3.config.shards.shard_file_name`), read-only, with ``<file>.sha256`` beside it (what
its bytes hashed to while they were fetched, and the shard it is). A shard a job reads is
hard-linked into that job's directory, so ``st_nlink > 1`` means some job still links it: only
entries with one link are evicted, least recently used first (the sidecar's mtime is the last
use). Two locks, both ``flock`` (per open file, so threads of one process exclude each other
too): one per entry (``.<file>.lock``: exclusive while fetching or evicting it, shared while
linking it into a job), and one for the space (``.space.lock``), held while the cache is
summed, entries evicted and a fetch's room reserved. A fetch writes into
``.<file>.<size>.part``, whose name reserves its bytes before they arrive: the bytes on disk
never exceed the bound. A part whose entry nobody locks is left over from a dead process and is
removed. The whole directory is the worker's alone (0700): a job sees its own shards through
their links, never the cache.

Every entry counts as at least :attr:`ShardCache.floor` bytes (1 MiB, less only for a cache
under 1 GiB: a thousandth of it), so the number of entries, and the time the scan under the
space lock takes, stays bounded however small the shards are. An entry's lock file is removed
by whoever holds it exclusively when the entry is gone (evicted, or a fetch that failed); a
process that locks a lock file checks, once it holds it, that the file is still the one at the
lock's path (else it was removed meanwhile, and it locks the new one).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ace3_worker.shard_cache_boot import fsync_dir, settle_boot

CACHE_DIR_MODE = 0o700
SHARD_MODE = 0o444
SIDECAR_SUFFIX = ".sha256"
SPACE_LOCK = ".space.lock"
# How often a fetch that waits for room looks again (entries are unlinked as jobs move on).
ROOM_POLL_SECONDS = 0.2
LOCK_POLL_SECONDS = 0.05
# The least an entry counts against the bound (its file, sidecar and lock cost something).
MIN_ENTRY_BYTES = 1024 * 1024

_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_FILE = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._-]*$")
_PART = re.compile(r"^\.(?P<file>.+)\.(?P<size>[0-9]+)\.part$")


class CacheTooSmallError(ValueError):
    """A shard larger than the whole cache: it can never be fetched."""


class CacheFullError(RuntimeError):
    """A reader's current shard waited for room longer than it may
    (``ACE3_DATASET_CACHE_WAIT_SECONDS``): the cache is held by shards running jobs read."""


@dataclass(frozen=True)
class CachedShard:
    path: Path
    sha256: str


@dataclass
class Reservation:
    """Room for one shard's bytes, held by the part file they are written into."""

    digest: str
    file: str
    size: int
    part: Path
    fd: int


@dataclass(frozen=True)
class _Entry:
    digest: str
    file: str
    size: int
    links: int
    last_used: float


def entry_floor(bound: int) -> int:
    """The least an entry counts against a cache of ``bound`` bytes."""
    return min(MIN_ENTRY_BYTES, max(1, bound // 1024))


def _flock(path: Path, operation: int) -> int | None:
    """A descriptor of ``path`` (created) holding ``operation``'s lock, or None when it would
    block. Once held, the file must still be the one at ``path``: a holder that removed it
    (:func:`_unlock` with ``remove``) left this process a lock on nothing, so it locks the file
    now there instead."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            held = os.fstat(fd)
            try:
                now = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                now = None
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            return fd
        os.close(fd)  # (removed while we waited for it: lock the one there now)


def _unlock(fd: int, remove: Path | None = None) -> None:
    """Release the lock; ``remove``: its file, unlinked first (only under an exclusive lock:
    no one else holds it, and whoever opened it meanwhile finds it gone once they hold it)."""
    if remove is not None:
        with contextlib.suppress(FileNotFoundError):
            remove.unlink()
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


class ShardCache:
    """One cache directory and its bound. Stateless: every process and feeder may make its own;
    they agree through the files and their locks."""

    def __init__(self, root: Path, bound: int) -> None:
        self.root = root
        self.bound = bound
        self.floor = entry_floor(bound)
        self._unsynced: bool | None = None  # (settled once: :mod:`ace3_worker.shard_cache_boot`)

    @property
    def unsynced(self) -> bool:
        """Whether entries are written without fsync (the cache is this boot's), settled before
        this process first looks up or reserves an entry."""
        if self._unsynced is None:
            with self._space():
                self._unsynced = settle_boot(self.root)
        return self._unsynced

    def accounted(self, size: int) -> int:
        """What a shard of ``size`` bytes counts against the bound."""
        return max(size, self.floor)

    # -- paths -----------------------------------------------------------------------------------
    def _dir(self, digest: str) -> Path:
        if not _DIGEST.match(digest):
            raise ValueError(f"not a manifest digest: {digest!r}")
        return self.root / digest

    def path(self, digest: str, file: str) -> Path:
        if not _FILE.match(file) or file.endswith(SIDECAR_SUFFIX):
            raise ValueError(f"not a shard file name: {file!r}")
        return self._dir(digest) / file

    def _sidecar(self, digest: str, file: str) -> Path:
        return self._dir(digest) / f"{file}{SIDECAR_SUFFIX}"

    def _lock_path(self, digest: str, file: str) -> Path:
        return self._dir(digest) / f".{file}.lock"

    def _make_dirs(self, digest: str) -> None:
        self.root.mkdir(mode=CACHE_DIR_MODE, parents=True, exist_ok=True)
        self._dir(digest).mkdir(mode=CACHE_DIR_MODE, exist_ok=True)

    # -- locks -----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(
        self, digest: str, file: str, *, shared: bool = False, stop: threading.Event | None = None
    ) -> Iterator[bool]:
        """Hold the entry's lock (exclusive, or shared); yields False when ``stop`` was set
        before it could be had (without ``stop``: yields False at once when it is taken)."""
        _ = self.unsynced  # (an earlier boot's entries, locks included, are gone first)
        self._make_dirs(digest)
        operation = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        lock = self._lock_path(digest, file)
        fd = _flock(lock, operation)
        while fd is None and stop is not None and not stop.wait(LOCK_POLL_SECONDS):
            fd = _flock(lock, operation)
        try:
            yield fd is not None
        finally:
            if fd is not None:
                gone = not shared and not self._exists(digest, file)
                _unlock(fd, lock if gone else None)

    def _exists(self, digest: str, file: str) -> bool:
        """Whether the entry is there (its part exists only under its exclusive lock)."""
        return os.path.lexists(self.path(digest, file))

    @contextlib.contextmanager
    def _space(self) -> Iterator[None]:
        self.root.mkdir(mode=CACHE_DIR_MODE, parents=True, exist_ok=True)
        fd = os.open(self.root / SPACE_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            _unlock(fd)

    # -- reading ---------------------------------------------------------------------------------
    def lookup(self, digest: str, file: str) -> CachedShard | None:
        """The complete entry with its recorded sha256, or None."""
        path = self.path(digest, file)
        _ = self.unsynced  # (an earlier boot's entries are gone before one is trusted)
        try:
            record = json.loads(self._sidecar(digest, file).read_text())
            path.lstat()
        except (OSError, ValueError):
            return None
        sha256 = record.get("sha256") if isinstance(record, dict) else None
        return CachedShard(path, sha256) if isinstance(sha256, str) else None

    def touch(self, digest: str, file: str) -> None:
        """Mark the entry used now (what eviction orders by)."""
        with contextlib.suppress(OSError):
            os.utime(self._sidecar(digest, file))

    def usage(self) -> int:
        """Bytes the cache holds and has reserved."""
        with self._space():
            entries, reserved = self._scan()
        return sum(entry.size for entry in entries) + reserved

    def _scan(self) -> tuple[list[_Entry], int]:
        """Every complete entry, and the bytes reserved by live fetches (parts left over by a
        dead process are removed). Called with the space lock held."""
        entries: list[_Entry] = []
        reserved = 0
        if not self.root.is_dir():
            return entries, reserved
        for directory in os.scandir(self.root):
            if not _DIGEST.match(directory.name) or not directory.is_dir(follow_symlinks=False):
                continue
            for item in os.scandir(directory.path):
                part = _PART.match(item.name)
                if part is not None:
                    reserved += self._live_part(directory.name, part["file"], int(part["size"]))
                    continue
                if item.name.startswith(".") or item.name.endswith(SIDECAR_SUFFIX):
                    continue
                try:
                    info = item.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                try:
                    used = os.stat(f"{item.path}{SIDECAR_SUFFIX}").st_mtime
                except FileNotFoundError:
                    used = 0.0  # (no sidecar: a damaged entry, evicted first)
                size = self.accounted(info.st_size)
                entries.append(_Entry(directory.name, item.name, size, info.st_nlink, used))
        return entries, reserved

    def _live_part(self, digest: str, file: str, size: int) -> int:
        """A part's reserved bytes; 0 (and the part gone) when no fetch holds its entry."""
        lock = self._lock_path(digest, file)
        fd = _flock(lock, fcntl.LOCK_EX)
        if fd is None:
            return self.accounted(size)
        try:
            with contextlib.suppress(FileNotFoundError):
                (self._dir(digest) / f".{file}.{size}.part").unlink()
        finally:
            _unlock(fd, None if self._exists(digest, file) else lock)
        return 0

    # -- writing ---------------------------------------------------------------------------------
    def _evict(self, entry: _Entry) -> bool:
        """Remove an entry no job links and no one else holds; whether it went."""
        lock = self._lock_path(entry.digest, entry.file)
        fd = _flock(lock, fcntl.LOCK_EX)
        if fd is None:
            return False
        gone = False
        try:
            path = self.path(entry.digest, entry.file)
            try:
                if path.lstat().st_nlink != 1:
                    return False
            except FileNotFoundError:
                return False
            path.unlink()
            with contextlib.suppress(FileNotFoundError):
                self._sidecar(entry.digest, entry.file).unlink()
            gone = True
            return True
        finally:
            _unlock(fd, lock if gone else None)

    def reserve(
        self,
        digest: str,
        file: str,
        size: int,
        *,
        stop: threading.Event,
        wait: bool,
        waiting: Callable[[float, int], None] | None = None,
        wait_seconds: float | None = None,
    ) -> Reservation | None:
        """Room for ``size`` bytes of the entry (whose lock the caller holds): least recently
        used entries no job links are evicted until it fits. When it cannot fit yet (every other
        byte is linked or being fetched): None at once, or with ``wait`` until it fits (None if
        ``stop`` is set first; ``waiting(seconds, linked_bytes)`` is called every few seconds
        meanwhile; :class:`CacheFullError` after ``wait_seconds``)."""
        if size > self.bound:
            raise CacheTooSmallError(
                f"{size} bytes, more than the whole dataset cache holds "
                f"(ACE3_DATASET_CACHE_BYTES={self.bound})"
            )
        self._make_dirs(digest)
        started = time.monotonic()
        reported = started
        while True:
            with self._space():
                entries, reserved = self._scan()
                used = reserved + sum(entry.size for entry in entries)
                needed = self.accounted(size)
                for entry in sorted(entries, key=lambda e: (e.last_used, e.digest, e.file)):
                    if used + needed <= self.bound:
                        break
                    if entry.links == 1 and self._evict(entry):
                        used -= entry.size
                if used + needed <= self.bound:
                    part = self._dir(digest) / f".{file}.{size}.part"
                    with contextlib.suppress(FileNotFoundError):
                        part.unlink()  # (left by an earlier fetch of ours that died)
                    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
                    return Reservation(digest, file, size, part, os.open(part, flags, 0o600))
                linked = sum(entry.size for entry in entries if entry.links > 1)
            if not wait or stop.wait(ROOM_POLL_SECONDS):
                return None
            if wait_seconds is not None and time.monotonic() - started >= wait_seconds:
                raise CacheFullError(
                    f"waited {wait_seconds:.0f} s (ACE3_DATASET_CACHE_WAIT_SECONDS) for room in "
                    f"the dataset cache: {linked} of its {self.bound} bytes "
                    "(ACE3_DATASET_CACHE_BYTES) hold shards running jobs read"
                )
            if waiting is not None and time.monotonic() - reported >= 30:
                reported = time.monotonic()
                waiting(reported - started, linked)

    def commit(self, reservation: Reservation, sha256: str, record: dict[str, Any]) -> Path:
        """The reserved entry's bytes are all written: make them read-only (and durable, where
        the cache is not tagged with this boot), record the sidecar, and put the entry in
        place."""
        fd, unsynced = reservation.fd, self.unsynced
        try:
            if not unsynced:
                os.fsync(fd)
            os.fchmod(fd, SHARD_MODE)
        finally:
            os.close(fd)
        sidecar = self._sidecar(reservation.digest, reservation.file)
        temporary = sidecar.with_name(f".{sidecar.name}.tmp")
        temporary.write_text(json.dumps({"sha256": sha256, **record}, sort_keys=True) + "\n")
        temporary.chmod(0o600)
        os.replace(temporary, sidecar)
        path = self.path(reservation.digest, reservation.file)
        os.replace(reservation.part, path)
        if not unsynced:
            fsync_dir(path.parent)
        return path

    @staticmethod
    def abandon(reservation: Reservation) -> None:
        with contextlib.suppress(OSError):
            os.close(reservation.fd)
        with contextlib.suppress(FileNotFoundError):
            reservation.part.unlink()

    def discard(self, digest: str, file: str) -> None:
        """Remove a damaged entry (the caller holds its lock)."""
        for path in (self.path(digest, file), self._sidecar(digest, file)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
