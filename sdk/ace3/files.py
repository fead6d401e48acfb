"""File hashing and atomic writes: the one copy the SDK, the engine, the server and the worker
use.

An atomic write goes to a temporary file in the target's directory (same filesystem), is
flushed and fsync'ed, renamed over the target with ``os.replace`` and the directory fsync'ed:
a reader sees the old file or the whole new one, never a partial one, and a crash leaves at
most a hidden temporary file (``.<name>.tmp-*``). Torch-free.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class WrittenFile:
    """A file written atomically: where it is, and its bytes' sha256 and size."""

    path: Path
    sha256: str
    size_bytes: int


def sha256_fileobj(fileobj: BinaryIO, chunk_size: int = CHUNK_BYTES) -> str:
    """sha256 hex digest of a binary file object read from its current position to the end."""
    digest = hashlib.sha256()
    while chunk := fileobj.read(chunk_size):
        digest.update(chunk)
    return digest.hexdigest()


def sha256_file(path: str | os.PathLike[str], chunk_size: int = CHUNK_BYTES) -> str:
    """sha256 hex digest of a file, read in chunks (constant memory)."""
    with open(path, "rb") as handle:
        return sha256_fileobj(handle, chunk_size)


def fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (where the platform allows it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # not supported on this platform or filesystem
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # (not on Windows)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def _create_temporary(target: Path, mode: int) -> tuple[Path, int]:
    """A new empty file next to ``target``, created exclusively (never through a planted link)
    with ``mode`` less the umask; its path and a descriptor open for reading and writing. Named
    ``.<name>.tmp-<random>``, or ``.tmp-<random>`` when the name is too long for that."""
    prefix = f".{target.name}.tmp-" if len(target.name) <= 200 else ".tmp-"
    for _ in range(100):
        tmp = target.with_name(prefix + secrets.token_hex(6))
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW, mode)
        except FileExistsError:
            continue
        return tmp, fd
    raise FileExistsError(f"no free temporary name next to {target}")


def _fsync(fd: int) -> None:
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):  # (a filesystem without fsync)
            raise


def _fsync_path(path: Path) -> None:
    """fsync a file written by name, opened again without following a link or blocking on a
    FIFO; only a regular file."""
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{path} is not a regular file")
        _fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _replacing(target: Path, mode: int) -> Iterator[tuple[Path, int]]:
    """A new temporary file next to ``target`` (its path and an open read-write descriptor,
    the caller's to close); on a clean exit it is renamed over ``target`` and the directory
    fsync'ed, on an exception removed (``target`` untouched). The caller fsyncs the file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp, fd = _create_temporary(target, mode)
    try:
        yield tmp, fd
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_directory(target.parent)


@contextlib.contextmanager
def atomic_path(target: Path, mode: int = 0o666) -> Iterator[Path]:
    """A temporary path next to ``target`` to write by name; on a clean exit it is fsync'ed and
    renamed over ``target``, on an exception removed (``target`` untouched). ``mode``: the
    permissions (less the umask) of the new file, those of ``open(target, "w")`` by default."""
    with _replacing(target, mode) as (tmp, fd):
        os.close(fd)
        yield tmp
        _fsync_path(tmp)


def write_atomic(path: Path, write: Callable[[BinaryIO], object], mode: int = 0o666) -> WrittenFile:
    """Create or replace ``path`` atomically with what ``write(handle)`` writes; return its
    sha256 and size (read back from the written file, so they describe what is on disk)."""
    with _replacing(path, mode) as (_, fd), os.fdopen(fd, "w+b") as handle:
        write(handle)
        handle.flush()
        _fsync(handle.fileno())
        handle.seek(0)
        digest = sha256_fileobj(handle)
        size = os.fstat(handle.fileno()).st_size
    return WrittenFile(path=path.resolve(), sha256=digest, size_bytes=size)


def write_bytes_atomic(path: Path, data: bytes) -> WrittenFile:
    """``write_atomic`` for bytes already in memory."""
    return write_atomic(path, lambda handle: handle.write(data) and None)
