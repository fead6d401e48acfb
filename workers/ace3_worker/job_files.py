"""Open what a job wrote without trusting its paths: no links, no ``..``, nothing outside.

Everything under a job's ``output/`` belongs to the job, which may have replaced any of it
(directories included) with a symbolic link, a FIFO or a hard link to a file it could reach. The
worker reads those files with more privileges than the job, so it opens them one path component
at a time from a directory it created, each with ``O_NOFOLLOW``, and accepts only a regular
file (opened non-blocking, so a FIFO never hangs it). Nothing is ever followed out of the job's
directory, whatever the job does between the check and the open.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path, PurePosixPath


class UnsafeJobPathError(OSError):
    """A path a job named is not a plain file inside the directory it must be in."""


def _components(relative: str | PurePosixPath) -> list[str]:
    text = str(relative)
    if "\0" in text:
        raise UnsafeJobPathError(errno.EINVAL, "the path holds a NUL byte")
    parts = PurePosixPath(text).parts
    if not parts or PurePosixPath(text).is_absolute():
        raise UnsafeJobPathError(errno.EINVAL, f"{text!r} is not a relative path")
    if any(part in ("..", ".") for part in parts):
        raise UnsafeJobPathError(errno.EINVAL, f"{text!r} steps out of its directory")
    return list(parts)


def open_job_file(root: Path, relative: str | PurePosixPath) -> int:
    """A read-only descriptor of the regular file ``root/relative``, opened without following
    a link anywhere below ``root`` (``root`` itself is the worker's own directory).

    Raises :class:`UnsafeJobPathError` (or FileNotFoundError) for anything else."""
    parts = _components(relative)
    directory_flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(root, directory_flags)
    try:
        for part in parts[:-1]:
            try:
                next_fd = os.open(part, directory_flags, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UnsafeJobPathError(exc.errno, f"{part!r} is not a directory") from exc
                raise
            os.close(fd)
            fd = next_fd
        try:
            file_fd = os.open(
                parts[-1],
                os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY,
                dir_fd=fd,
            )
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafeJobPathError(exc.errno, f"{parts[-1]!r} is a link") from exc
            raise
    finally:
        os.close(fd)
    info = os.fstat(file_fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(file_fd)
        raise UnsafeJobPathError(errno.EINVAL, f"{relative} is not a regular file")
    if info.st_nlink != 1:
        os.close(file_fd)
        raise UnsafeJobPathError(errno.EMLINK, f"{relative} has other hard links")
    return file_fd
