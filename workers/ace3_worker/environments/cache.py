"""This machine's cache of environments (``ACE3_ENV_CACHE_DIR``, default
``<data_dir>/environments``), shared by the machine's worker processes and bounded by
``ACE3_ENV_CACHE_BYTES``.

Layout: ``<cache>/<hash>/`` a complete tree (read-only, the worker's), ``<cache>/.<hash>.bytes``
its size, ``<cache>/.<hash>.lock`` its lock, and ``.space.lock``. A tree appears whole: it is
unpacked into ``.<hash>.tmp-*`` and renamed into place. Locks are ``flock`` (per open file, so
threads exclude each other too): an entry's lock is held exclusively while it is installed or
evicted, and shared by every attempt that uses it (:class:`Pin`), from before its tree is linked
into the attempt's directory until the attempt is over; ``.space.lock`` is held while the cache
is summed and entries evicted. Eviction removes the least recently used trees nobody pins
(the tree's mtime is its last use) until the cache fits its bound; a pinned one is never
removed. The whole directory is the worker's alone (0700) and hidden from jobs
(:func:`ace3_worker.sandbox.plan.protected_paths`): a job sees its environment through the
links in its own directory.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

CACHE_DIR_MODE = 0o700
READ_ONLY_DIR = 0o555
SPACE_LOCK = ".space.lock"
_HASH = re.compile(r"^[0-9a-f]{64}$")


def _open_lock(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)


def remove_tree(path: Path) -> None:
    """Remove a read-only tree (its directories made writable first, links never followed)."""
    if not path.exists() and not path.is_symlink():
        return
    for directory, subdirectories, _ in os.walk(path):
        for name in subdirectories:
            entry = Path(directory) / name
            if not entry.is_symlink():
                entry.chmod(0o700)
    if not path.is_symlink():
        path.chmod(0o700)
    shutil.rmtree(path, ignore_errors=True)


@dataclass
class Pin:
    """An attempt's use of a cached tree: the entry's lock, held shared until :meth:`release`."""

    path: Path
    fd: int | None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


@dataclass(frozen=True)
class _Entry:
    hash: str
    size: int
    last_used: float


class EnvironmentCache:
    """One cache directory and its bound. Stateless: every worker process may make its own;
    they agree through the files and their locks."""

    def __init__(self, root: Path, bound: int) -> None:
        self.root = root
        self.bound = bound

    def _ready_root(self) -> None:
        self.root.mkdir(mode=CACHE_DIR_MODE, parents=True, exist_ok=True)
        if self.root.stat().st_uid == os.geteuid():
            self.root.chmod(CACHE_DIR_MODE)

    def tree(self, environment_hash: str) -> Path:
        return self.root / environment_hash

    def _lock_path(self, environment_hash: str) -> Path:
        if not _HASH.match(environment_hash):
            raise ValueError(f"not an environment hash: {environment_hash!r}")
        return self.root / f".{environment_hash}.lock"

    def pin_if_present(self, environment_hash: str) -> Pin | None:
        """A pin of the cached tree (its last use now), or None when it is not cached."""
        self._ready_root()
        fd = _open_lock(self._lock_path(environment_hash))
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            tree = self.tree(environment_hash)
            if not tree.is_dir():
                os.close(fd)
                return None
            os.utime(tree)
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
        return Pin(tree, fd)

    @contextlib.contextmanager
    def installing(self, environment_hash: str) -> Iterator[bool]:
        """Hold the entry's lock exclusively (waiting for another process installing it): the
        caller installs the tree (:meth:`install`) unless the value is True (it is there)."""
        self._ready_root()
        fd = _open_lock(self._lock_path(environment_hash))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield self.tree(environment_hash).is_dir()
        finally:
            os.close(fd)

    def scratch(self, environment_hash: str) -> Path:
        """A new path to unpack an entry's tree into, beside where it goes."""
        self._ready_root()
        return self.root / f".{environment_hash}.tmp-{secrets.token_hex(4)}"

    def install(self, environment_hash: str, unpacked: Path, size: int) -> None:
        """Move the read-only tree ``unpacked`` (from :meth:`scratch`) into place, under the
        entry's exclusive lock (:meth:`installing`), then make room for it."""
        (self.root / f".{environment_hash}.bytes").write_text(str(size))
        unpacked.chmod(READ_ONLY_DIR)
        os.rename(unpacked, self.tree(environment_hash))
        self.evict(keep=environment_hash)

    def entries(self) -> list[_Entry]:
        """The cached trees, least recently used first."""
        found = []
        with contextlib.suppress(FileNotFoundError):
            for path in self.root.iterdir():
                if not _HASH.match(path.name) or path.is_symlink():
                    continue
                try:
                    size = int((self.root / f".{path.name}.bytes").read_text())
                    found.append(_Entry(path.name, size, path.stat().st_mtime))
                except (OSError, ValueError):
                    found.append(_Entry(path.name, 0, 0.0))
        return sorted(found, key=lambda entry: (entry.last_used, entry.hash))

    def evict(self, keep: str | None = None) -> list[str]:
        """Remove least recently used trees nobody pins until the cache fits its bound; the
        hashes removed."""
        self._ready_root()
        removed: list[str] = []
        space = _open_lock(self.root / SPACE_LOCK)
        try:
            fcntl.flock(space, fcntl.LOCK_EX)
            entries = self.entries()
            total = sum(entry.size for entry in entries)
            for entry in entries:
                if total <= self.bound:
                    break
                if entry.hash == keep or not self._remove_unpinned(entry.hash):
                    continue
                total -= entry.size
                removed.append(entry.hash)
        finally:
            os.close(space)
        if removed:
            logger.info("environment cache: evicted %s", ", ".join(h[:12] for h in removed))
        return removed

    def _remove_unpinned(self, environment_hash: str) -> bool:
        fd = _open_lock(self._lock_path(environment_hash))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False  # (pinned by a running attempt, or being installed)
        try:
            doomed = self.root / f".{environment_hash}.evicted-{secrets.token_hex(4)}"
            os.rename(self.tree(environment_hash), doomed)  # (gone at once for everyone)
            (self.root / f".{environment_hash}.bytes").unlink(missing_ok=True)
            remove_tree(doomed)
            return True
        except FileNotFoundError:
            return False
        finally:
            os.close(fd)

    def sweep(self, min_age: float = 3600.0) -> None:
        """Remove unpacks and evictions a dead process left half done."""
        now = time.time()
        with contextlib.suppress(FileNotFoundError):
            for path in self.root.iterdir():
                if (".tmp-" in path.name or ".evicted-" in path.name) and (
                    now - path.lstat().st_mtime > min_age
                ):
                    remove_tree(path)


def link_tree(source: Path, target: Path) -> int:
    """Recreate ``source``'s tree at the new path ``target``: directories made, files
    hard-linked (copied when the two are on different filesystems), links copied as links;
    directories read-only afterwards. The number of files."""
    files = 0
    copying = False
    for directory, subdirectories, names in os.walk(source):
        relative = Path(directory).relative_to(source)
        into = target / relative
        into.mkdir(mode=0o755, exist_ok=relative != Path("."))
        for name in [*names, *(s for s in subdirectories if (Path(directory) / s).is_symlink())]:
            origin, copy = Path(directory) / name, into / name
            if origin.is_symlink():
                os.symlink(os.readlink(origin), copy)
                continue
            files += 1
            if not copying:
                try:
                    os.link(origin, copy, follow_symlinks=False)
                    continue
                except OSError as exc:
                    if exc.errno != errno.EXDEV:
                        raise
                    copying = True
            shutil.copyfile(origin, copy, follow_symlinks=False)
            copy.chmod(0o444)
    for directory, subdirectories, _ in os.walk(target, topdown=False):
        for name in subdirectories:
            entry = Path(directory) / name
            if not entry.is_symlink():
                entry.chmod(READ_ONLY_DIR)
    target.chmod(READ_ONLY_DIR)
    return files
