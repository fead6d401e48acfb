"""Directories held in use by an exclusive ``flock`` on their own fd, and the sweeps that
remove those nobody holds.

Worker processes share a machine's work directory, and each one starting sweeps what killed
processes left (warm skeletons, build scratch). A directory is made, then locked: between the
two, a sweep in another process can lock the new directory, find it unheld and remove it. The
maker then holds a removed inode and everything it puts "there" fails later (a warm skeleton
renamed into a job's attempt: "No such file or directory"). :func:`make_held_dir` therefore
checks, once it holds the lock, that the path still names the inode it locked, and makes
another directory when it does not; :func:`lock_if_unheld` makes the same check before a sweep
removes anything.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_TRIES = 100  # (each try loses only to a sweep running in the same instant)


def make_held_dir(parent: Path, new_name: Callable[[], str], mode: int) -> tuple[Path, int]:
    """A new directory ``parent/<new_name()>`` (``mode``), and the fd that holds its lock: the
    caller keeps it open while it uses the directory, and closes it after removing it."""
    for _ in range(MAX_TRIES):
        path = parent / new_name()
        path.mkdir(mode=mode)
        try:
            fd = os.open(path, DIR_FLAGS)
        except FileNotFoundError:
            continue  # (a sweep removed it before it was locked: make another)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if _names(path, fd):
                return path, fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    raise OSError(f"could not make a directory under {parent} that stayed there to be locked")


def lock_if_unheld(path: Path) -> int | None:
    """The fd of ``path``'s lock, taken without waiting, when nobody holds it and ``path`` still
    names the locked directory (a sweep may then remove it); None otherwise."""
    try:
        fd = os.open(path, DIR_FLAGS)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if _names(path, fd):
            return fd
    except OSError:
        pass  # (held by a live process, or removed meanwhile)
    os.close(fd)
    return None


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` (not followed) is the directory open as ``fd``."""
    try:
        there = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino)
