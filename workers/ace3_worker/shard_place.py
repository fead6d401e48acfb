"""Putting a cached shard into a job's directory."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path

from ace3_worker.shard_cache import SHARD_MODE


def place(source: Path, target: Path) -> None:
    """Put the cached shard ``source`` at ``target`` in a job's directory, whole or not at all
    (made under a hidden name, renamed into place): a hard link (the job then holds the entry
    against eviction), or a read-only copy when the two are on different filesystems."""
    temporary = target.with_name(f".{target.name}.new")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    try:
        os.link(source, temporary)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            raise
        shutil.copyfile(source, temporary)
        temporary.chmod(SHARD_MODE)
        with temporary.open("rb") as handle:
            os.fsync(handle.fileno())
    os.replace(temporary, target)
