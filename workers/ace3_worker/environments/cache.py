"""This machine's cache of environments (``ACE3_ENV_CACHE_DIR``, default
``<data_dir>/environments``), shared by the machine's worker processes and bounded by
``ACE3_ENV_CACHE_BYTES``.

Layout: ``<cache>/<hash>/`` a complete tree (read-only, the worker's), ``<cache>/.<hash>.bytes``
its size, ``<cache>/.<hash>.lock`` its lock, and ``.space.lock``. A tree appears whole: it is
unpacked into ``.<hash>.tmp-*`` (a fetched archive beside it, ``.<hash>.tmp-*.tar.gz``) and
renamed into place. Locks are ``flock`` (per open file, so threads exclude each other too): an
entry's lock is held exclusively while it is installed or evicted, and shared by every attempt
that uses it (:class:`Pin`), from before its tree is linked into the attempt's directory until
the attempt is over; ``.space.lock`` is held while the cache is summed and entries evicted. A
preparation waiting for an entry's lock polls it, so that the attempt's interrupt (its job
cancelled) stops the wait (:class:`~.uv_commands.PreparationInterrupted`). Eviction removes the
least recently used trees nobody pins (the tree's mtime is its last use) until the cache fits
its bound; a pinned one is never removed. What a killed process left half done (an unpack, an
archive, an eviction) is removed by :meth:`EnvironmentCache.sweep`, once per worker process,
under the entry's lock: another live process's install is never touched. The whole directory
is the worker's alone (0700) and hidden from jobs
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
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ace3_worker.environments.uv_commands import PreparationInterrupted

logger = logging.getLogger(__name__)

CACHE_DIR_MODE = 0o700
READ_ONLY_DIR = 0o555
SPACE_LOCK = ".space.lock"
# How a preparation waiting for an entry's lock polls it: soon at first, then less often.
LOCK_FIRST_SECONDS = 0.01
LOCK_MAX_SECONDS = 0.25
_HASH = re.compile(r"^[0-9a-f]{64}$")
# What a process leaves beside the trees while it works: an unpack, a fetched archive, an
# eviction (and an earlier version's fetched archive, .<hash>.tar.gz), and a size.
_LEFTOVER = re.compile(
    r"^\.(?P<hash>[0-9a-f]{64})\."
    r"(?:(?:tmp|evicted)-[0-9a-f]+(?:\.tar\.gz)?|tar\.gz|(?P<bytes>bytes))$"
)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_lock(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)


def _lock_within(fd: int, operation: int, interrupt: threading.Event | None, what: str) -> None:
    """``flock(fd, operation)``, waiting for it; with ``interrupt``, polled (a short backoff)
    so that setting it stops the wait: :class:`PreparationInterrupted`."""
    if interrupt is None:
        fcntl.flock(fd, operation)
        return
    delay = LOCK_FIRST_SECONDS
    while True:
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        if interrupt.wait(delay):
            raise PreparationInterrupted(f"stopped waiting for {what}")
        delay = min(delay * 2, LOCK_MAX_SECONDS)


def _open_directory(name: str | Path, dir_fd: int | None) -> int | None:
    """An fd of the directory ``name`` (never through a link), made readable first when it is
    not; None when it is no directory (a link, a file, gone)."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        with contextlib.suppress(OSError, NotImplementedError):
            os.chmod(name, 0o700, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None


def _make_removable(fd: int) -> None:
    """Give the directory ``fd`` and every directory under it u+rwx (their entries can then be
    removed), through fds opened without following a link."""
    with contextlib.suppress(OSError):
        os.fchmod(fd, stat.S_IMODE(os.fstat(fd).st_mode) | 0o700)
    try:
        with os.scandir(fd) as entries:
            names = [entry.name for entry in entries if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for name in names:
        child = _open_directory(name, fd)
        if child is None:
            continue
        try:
            _make_removable(child)
        finally:
            os.close(child)


def remove_tree(path: Path) -> bool:
    """Remove ``path`` whole, a read-only tree (0555 directories, another uid's files) too:
    its directories are made writable first, links never followed (a link planted in the tree
    never makes the worker change anything outside it), then it goes (``shutil.rmtree``, which
    follows no link either). A link or a file at ``path`` is unlinked. Whether it is gone."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return True
    if not stat.S_ISDIR(info.st_mode):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return True
    fd = _open_directory(path, None)
    if fd is not None:
        try:
            _make_removable(fd)
        finally:
            os.close(fd)
    shutil.rmtree(path, ignore_errors=True)
    gone = not os.path.lexists(path)
    if not gone:
        logger.warning("could not remove %s whole", path)
    return gone


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

    def pin_if_present(
        self, environment_hash: str, interrupt: threading.Event | None = None
    ) -> Pin | None:
        """A pin of the cached tree (its last use now), or None when it is not cached; waits
        while another process installs or evicts it, until ``interrupt`` is set."""
        self._ready_root()
        fd = _open_lock(self._lock_path(environment_hash))
        try:
            _lock_within(fd, fcntl.LOCK_SH, interrupt, f"environment {environment_hash[:12]}")
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
    def installing(
        self, environment_hash: str, interrupt: threading.Event | None = None
    ) -> Iterator[bool]:
        """Hold the entry's lock exclusively (waiting for another process installing it, until
        ``interrupt`` is set: :class:`PreparationInterrupted`): the caller installs the tree
        (:meth:`install`) unless the value is True (it is there)."""
        self._ready_root()
        fd = _open_lock(self._lock_path(environment_hash))
        try:
            what = f"another process's install of environment {environment_hash[:12]}"
            _lock_within(fd, fcntl.LOCK_EX, interrupt, what)
            yield self.tree(environment_hash).is_dir()
        finally:
            os.close(fd)

    def scratch(self, environment_hash: str) -> Path:
        """A new path to unpack an entry's tree into, beside where it goes."""
        self._ready_root()
        return self.root / f".{environment_hash}.tmp-{secrets.token_hex(4)}"

    def scratch_archive(self, environment_hash: str) -> Path:
        """A new path to fetch an entry's archive to, beside where its tree goes."""
        return self.scratch(environment_hash).with_name(
            f".{environment_hash}.tmp-{secrets.token_hex(4)}.tar.gz"
        )

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

    def sweep(self) -> list[Path]:
        """Remove what dead processes left half done (unpacks, fetched archives, evictions, the
        size of a tree gone); the paths removed. Each entry's leftovers go under its lock, taken
        without waiting: those of an entry another live process installs, evicts or pins are
        left for a later sweep."""
        found: dict[str, list[Path]] = {}
        with contextlib.suppress(FileNotFoundError):
            for path in self.root.iterdir():
                match = _LEFTOVER.match(path.name)
                if match and not (match["bytes"] and self.tree(match["hash"]).is_dir()):
                    found.setdefault(match["hash"], []).append(path)
        removed: list[Path] = []
        for environment_hash, paths in sorted(found.items()):
            fd = _open_lock(self._lock_path(environment_hash))
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue  # (a live process's)
            try:
                for path in paths:
                    if path.name.endswith(".bytes") and self.tree(environment_hash).is_dir():
                        continue
                    if remove_tree(path):
                        removed.append(path)
            finally:
                os.close(fd)
        if removed:
            logger.warning(
                "environment cache: removed %d leftover(s) of a worker that ended mid-install: %s",
                len(removed),
                ", ".join(path.name for path in removed[:10]),
            )
        return removed


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
