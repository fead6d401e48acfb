"""Why the node's dataset cache does not fsync its entries, and what it does instead.

An entry's bytes and its sidecar are written, hashed and renamed into place; a process that dies
meanwhile leaves only a part file, which the next fetch removes, and the page cache keeps every
byte a finished write put there for every process of the machine, whoever died. What an fsync
adds is survival of a kernel crash or a power cut, that is of a reboot. Paying it on every
shard cost a fifth of the fetch throughput (``benchmarks/data_streaming.py``: 0.75-0.87 of a
plain ``download_file`` with it, 0.92-1.11 without, side by side on the same loaded machine).

So the cache is trusted only within the boot that wrote it. Before a process of this machine
first looks up or reserves an entry (:func:`settle_boot`, under the cache's space lock), it
compares the boot id the cache recorded (``.boot-id``) with the kernel's
(``/proc/sys/kernel/random/boot_id``, new at every boot): when they differ, every entry is
removed (after a crash, one renamed into place may hold bytes that never reached the disk) and
this boot's id is recorded, durably, before any entry of this boot is written. A cache without
the file was written by a worker that fsynced each entry: it is kept. Where the kernel has no
boot id, entries are fsynced as before. A cache directory must therefore belong to one machine
(two machines sharing one over a network filesystem would keep removing each other's entries).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
from pathlib import Path

logger = logging.getLogger(__name__)

BOOT_FILE = ".boot-id"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_ENTRY_DIR = re.compile(r"^[0-9a-f]{64}$")  # (a manifest digest: ShardCache's layout)


def current_boot() -> str | None:
    """This boot's id, or None where the kernel has none."""
    try:
        boot = BOOT_ID.read_text().strip()
    except OSError:
        return None
    return boot or None


def settle_boot(root: Path) -> bool:
    """Make the cache at ``root`` this boot's (the caller holds its space lock): True when its
    entries need no fsync, False when they must be fsynced (no boot id)."""
    boot = current_boot()
    if boot is None:
        return False
    marker = root / BOOT_FILE
    try:
        recorded: str | None = marker.read_text().strip()
    except FileNotFoundError:
        recorded = None
    if recorded == boot:
        return True
    if recorded is not None:
        removed = _remove_entries(root)
        if removed:
            logger.warning(
                "dataset cache %s: removed the %d shard director%s an earlier boot left "
                "(entries are not fsynced, so they are trusted only in the boot that wrote them)",
                root,
                removed,
                "y" if removed == 1 else "ies",
            )
    temporary = root / f"{BOOT_FILE}.tmp"
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, f"{boot}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, marker)
    fsync_dir(root)
    return True


def _remove_entries(root: Path) -> int:
    """Remove every entry directory under ``root``; how many there were."""
    removed = 0
    for path in root.iterdir():
        if _ENTRY_DIR.match(path.name) and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
            removed += 1
    return removed


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
