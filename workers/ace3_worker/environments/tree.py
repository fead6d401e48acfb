"""Walking a build's directories as root without ever following a link: measuring them while
uv writes, and making the finished tree the worker's and read-only.

Every directory is opened relative to its parent's descriptor with ``O_NOFOLLOW|O_DIRECTORY``
and every file with ``O_NOFOLLOW``, and the file is then changed through its descriptor
(``fchown``, ``fchmod``): a name swapped for a link (by a process of the build uid, were one
still running) makes the walk fail, never redirects a ``chown``/``chmod`` outside the tree.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ace3_worker.environments.uv_commands import EnvironmentRefusedError

READ_ONLY_FILE = 0o444
EXECUTABLE_FILE = 0o555  # (a file that had any exec bit: a bundled binary, a console script)
READ_ONLY_DIR = 0o555
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# (O_NONBLOCK: opening a FIFO planted in the tree never blocks; O_NOCTTY: nor adopts a tty)
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


@dataclass
class TreeUsage:
    """What a tree holds: the bytes of its files and its entries (files, directories, links)."""

    bytes: int = 0
    entries: int = 0


def _entries(top: int) -> Iterator[tuple[int, str, os.stat_result, int | None]]:
    """Depth-first below the directory ``top``, each directory after what it holds:
    ``(parent fd, name, lstat, the directory's own fd or None)``; the walk opens and closes the
    descriptors (one per level)."""
    stack: list[tuple[int, str, Iterator[str]]] = [(top, "", iter(sorted(os.listdir(top))))]
    try:
        while stack:
            fd, own_name, names = stack[-1]
            name = next(names, None)
            if name is None:
                stack.pop()
                if stack:  # (a directory below the top, now that what it holds is done)
                    yield stack[-1][0], own_name, os.fstat(fd), fd
                    os.close(fd)
                continue
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                child = os.open(name, _DIRECTORY, dir_fd=fd)
                stack.append((child, name, iter(sorted(os.listdir(child)))))
            else:
                yield fd, name, info, None
    finally:
        for fd, _, _ in stack[1:]:
            with contextlib.suppress(OSError):
                os.close(fd)


def measure(path: Path, stop_past_entries: int | None = None) -> TreeUsage:
    """The bytes and entries under ``path`` (0 if it does not exist), counted until more than
    ``stop_past_entries`` entries are seen (a tree of millions of files is not walked whole)."""
    usage = TreeUsage()
    try:
        top = os.open(path, _DIRECTORY)
    except FileNotFoundError:
        return usage
    try:
        for _, _, info, _ in _entries(top):
            usage.entries += 1
            if stat.S_ISREG(info.st_mode):
                usage.bytes += info.st_size
            if stop_past_entries is not None and usage.entries > stop_past_entries:
                break
    except (FileNotFoundError, NotADirectoryError):
        pass  # (uv renamed or removed something meanwhile: the next poll counts it)
    finally:
        os.close(top)
    return usage


def take_ownership(path: Path) -> None:
    """Make the tree the worker's and read-only: files 0444, or 0555 where they had any exec
    bit, directories 0555 (setuid, setgid and sticky bits never survive); links are kept
    (owned by the worker, never followed); anything else (a FIFO, a socket) is removed; a file
    with another hard link is refused (changing it would change a file outside the tree)."""
    uid, gid = os.geteuid(), os.getegid()
    top = os.open(path, _DIRECTORY)
    try:
        for parent, name, info, directory in _entries(top):
            if directory is not None:
                os.fchown(directory, uid, gid)
                os.fchmod(directory, READ_ONLY_DIR)
            elif stat.S_ISLNK(info.st_mode):
                os.chown(name, uid, gid, dir_fd=parent, follow_symlinks=False)
            elif stat.S_ISREG(info.st_mode):
                _own_file(parent, name, info, uid, gid)
            else:
                os.unlink(name, dir_fd=parent)
        os.fchown(top, uid, gid)
        os.fchmod(top, READ_ONLY_DIR)
    finally:
        os.close(top)


def _own_file(parent: int, name: str, seen: os.stat_result, uid: int, gid: int) -> None:
    fd = os.open(name, _FILE, dir_fd=parent)
    try:
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) != (seen.st_dev, seen.st_ino) or not stat.S_ISREG(
            info.st_mode
        ):
            raise OSError(f"{name}: changed while the worker took the tree over")
        if info.st_nlink != 1:
            raise EnvironmentRefusedError(
                f"{name}: a file of the environment has another hard link; refused"
            )
        os.fchown(fd, uid, gid)
        os.fchmod(fd, EXECUTABLE_FILE if info.st_mode & 0o111 else READ_ONLY_FILE)
    finally:
        os.close(fd)
