"""Which attempt directories of the work directory are in use: each attempt a worker process
runs holds an exclusive ``flock`` on ``<work_dir>/.attempt-locks/<job>.<attempt dir>.lock``
(:func:`hold_attempt`) from before its directory is prepared until after it is removed. A worker
process starting (:func:`sweep_attempts`) removes the attempt directories nobody holds: those a
crashed or killed worker left, whose shard links would otherwise keep their cache entries from
being evicted forever. Workers sharing the work directory never remove each other's: a live
attempt's lock is held. The cache and the work directory on different filesystems (shards copied
into jobs, not linked) is said once (:func:`warn_if_copies`).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from ace3_worker.job_dir import unfreeze_and_retry

logger = logging.getLogger(__name__)

LOCK_DIR = ".attempt-locks"
# An attempt directory younger than this is left alone (its process may be about to lock it).
SWEEP_MIN_AGE_SECONDS = 60.0

_ATTEMPT = re.compile(r"^attempt-[0-9]+(-node-[0-9]+)?$")


def _lock_path(root: Path) -> Path:
    """The lock of the attempt directory ``<work_dir>/<job>/<attempt dir>``."""
    return root.parent.parent / LOCK_DIR / f"{root.parent.name}.{root.name}.lock"


def _lock(path: Path, blocking: bool) -> int | None:
    """An fd holding ``path``'s exclusive lock (the file still at ``path`` once held), or None
    when another process holds it and not ``blocking``."""
    path.parent.mkdir(mode=0o700, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            held = os.fstat(fd)
            now = os.stat(path, follow_symlinks=False)
        except BlockingIOError:
            os.close(fd)
            return None
        except FileNotFoundError:
            os.close(fd)  # (removed while we waited: lock the one there now)
            continue
        except BaseException:
            os.close(fd)
            raise
        if (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            return fd
        os.close(fd)


def _release(fd: int, path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    os.close(fd)


@contextlib.contextmanager
def hold_attempt(root: Path) -> Iterator[None]:
    """Hold the attempt directory ``root`` in use (waiting for a sweep of it to end)."""
    path = _lock_path(root)
    fd = _lock(path, blocking=True)
    assert fd is not None
    try:
        yield
    finally:
        _release(fd, path)


def sweep_attempts(work_dir: Path, *, min_age: float = SWEEP_MIN_AGE_SECONDS) -> list[Path]:
    """Remove the attempt directories no live worker process holds (older than ``min_age``
    seconds); the directories removed."""
    removed: list[Path] = []
    try:
        jobs = [p for p in work_dir.iterdir() if not p.name.startswith(".") and p.is_dir()]
    except OSError:
        return removed
    now = time.time()
    for job in jobs:
        try:
            attempts = [p for p in job.iterdir() if _ATTEMPT.match(p.name)]
        except OSError:
            continue
        for root in attempts:
            try:
                if now - root.lstat().st_mtime < min_age or root.is_symlink():
                    continue
            except OSError:
                continue
            path = _lock_path(root)
            fd = _lock(path, blocking=False)
            if fd is None:
                continue  # (a live attempt's)
            try:
                shutil.rmtree(root, onerror=unfreeze_and_retry)  # (read-only inputs too)
                removed.append(root)
            finally:
                _release(fd, path)
        with contextlib.suppress(OSError):
            job.rmdir()  # (only when empty)
    if removed:
        logger.warning(
            "removed %d attempt director%s left by a worker that ended without removing them: %s",
            len(removed),
            "y" if len(removed) == 1 else "ies",
            ", ".join(str(p) for p in removed[:10]),
        )
    return removed


def warn_if_copies(cache_dir: Path, work_dir: Path) -> bool:
    """Log a warning when the shard cache and the work directory are on different filesystems
    (each shard a job reads is then copied into it, not linked); whether they are."""
    try:
        apart = _device(cache_dir) != _device(work_dir)
    except OSError:
        return False
    if apart:
        logger.warning(
            "the dataset cache (%s) and the work directory (%s) are on different filesystems: "
            "every shard a job reads is copied into its directory instead of hard-linked; put "
            "ACE3_DATASET_CACHE_DIR on the filesystem of ACE3_WORK_DIR",
            cache_dir,
            work_dir,
        )
    return apart


def _device(path: Path) -> int:
    """The filesystem of ``path``, or of its nearest existing parent."""
    while not path.exists() and path.parent != path:
        path = path.parent
    return path.stat().st_dev
