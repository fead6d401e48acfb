"""File hashing and atomic writes: the one copy the SDK, the engine, the server and the worker
use.

An atomic write goes to a temporary file in the target's directory (same filesystem), is
flushed and fsync'ed, renamed over the target with ``os.replace`` and the directory fsync'ed:
a reader sees the old file or the whole new one, never a partial one, and a crash leaves at
most a hidden temporary file (``.<name>.tmp-*``). Torch-free.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
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


def _create_temporary(target: Path) -> Path:
    """A new empty file ``.<name>.tmp-<random>`` next to ``target``, created exclusively with
    the permissions a plain ``open(target, "w")`` would give (the umask applies)."""
    for _ in range(100):
        tmp = target.with_name(f".{target.name}.tmp-{secrets.token_hex(6)}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
        except FileExistsError:
            continue
        os.close(fd)
        return tmp
    raise FileExistsError(f"no free temporary name next to {target}")


@contextlib.contextmanager
def atomic_path(target: Path) -> Iterator[Path]:
    """A temporary path next to ``target`` to write by name; on a clean exit it is fsync'ed and
    renamed over ``target``, on an exception removed (``target`` untouched)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _create_temporary(target)
    try:
        yield tmp
        with tmp.open("rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_directory(target.parent)


def write_atomic(path: Path, write: Callable[[BinaryIO], None]) -> WrittenFile:
    """Create or replace ``path`` atomically with what ``write(handle)`` writes; return its
    sha256 and size (read back from the written file, so they describe what is on disk)."""
    with atomic_path(path) as tmp:
        with tmp.open("wb") as handle:
            write(handle)
            handle.flush()
        digest = sha256_file(tmp)
        size = tmp.stat().st_size
    return WrittenFile(path=path.resolve(), sha256=digest, size_bytes=size)


def write_bytes_atomic(path: Path, data: bytes) -> WrittenFile:
    """``write_atomic`` for bytes already in memory."""
    return write_atomic(path, lambda handle: handle.write(data) and None)
