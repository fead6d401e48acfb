"""Files a job holds open with no name left: they fill its filesystem as much as any file, and
the walk of its directories (:func:`ace3_worker.job_usage.disk_usage`), which goes by names,
never meets them."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from ace3_worker.job_usage import BLOCK_BYTES, ProcessEntry


def open_deleted_bytes(
    processes: Iterable[ProcessEntry], devices: set[int], proc: Path = Path("/proc")
) -> int:
    """The blocks of regular files on ``devices`` that the processes hold open with no name
    left (deleted while open, or made with ``O_TMPFILE``): they fill the disk as much as any
    file, and a walk by names never meets them. Each inode once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for process in processes:
        fds = proc / str(process.pid) / "fd"
        try:
            names = os.listdir(fds)
        except OSError:
            continue
        for name in names:
            try:
                info = os.stat(fds / name)  # (the open file itself, through its fd's link)
            except OSError:
                continue
            key = (info.st_dev, info.st_ino)
            if (
                info.st_nlink == 0
                and stat.S_ISREG(info.st_mode)
                and info.st_dev in devices
                and key not in seen
            ):
                seen.add(key)
                total += info.st_blocks * BLOCK_BYTES
    return total
