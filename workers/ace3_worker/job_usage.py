"""Measuring what one running job holds: the bytes its writable directories hold
(:func:`disk_usage`) and the memory its processes hold (:func:`memory_usage`), for the per-job
limits the worker enforces (:mod:`ace3_worker.usage_monitor`).

Disk is allocated blocks (``st_blocks``, 512 bytes each), not apparent sizes: a sparse file
holds only what was written to it. Links are never followed, and a file with several names in
the walked directories counts once. The walk reads one ``lstat`` per entry, so its cost grows
with the number of files (about 100,000 to 1,000,000 a second, with the entries in the page
cache): it stops at ``max_entries`` and says so, and the caller treats that as a limit of its
own (``ACE3_JOB_MAX_FILES``).

Memory is what the job's processes hold that the kernel cannot simply drop: the proportional
share (PSS) of their anonymous and swapped pages, from ``/proc/<pid>/smaps_rollup``: a page
shared by the 8 forked ranks of a job counts once in their sum, not 8 times as RSS would count
it. Shared memory (``Pss_Shmem``: ``/dev/shm`` files, ``memfd``, ``MAP_SHARED|MAP_ANONYMOUS``)
is taken together with the bytes the job's own ``/dev/shm`` holds (mapped or not): the larger
of the two, since a mapped ``/dev/shm`` file is in both. File-backed pages (the libraries, a
memory-mapped dataset or checkpoint) are page cache the kernel reclaims under pressure: not
counted. A kernel without the ``Pss_Anon`` breakdown (before 5.10) gives the whole PSS.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

BLOCK_BYTES = 512  # the unit of st_blocks


@dataclass(frozen=True)
class DiskUsage:
    bytes: int  # allocated, each inode once
    entries: int  # files, directories, links... walked (the roots too)
    complete: bool  # False: the walk stopped at max_entries, or at MAX_DEPTH
    too_deep: bool = False  # it stopped at a directory MAX_DEPTH below a root


# How deep below a root the walk goes (it holds two descriptors a level): a job nesting its
# directories deeper is stopped like one with too many files.
MAX_DEPTH = 100
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _Entries(Protocol):
    """What ``os.scandir`` returns."""

    def __next__(self) -> os.DirEntry[str]: ...

    def close(self) -> None: ...


class _Walk:
    """One measurement: every directory opened relative to its parent's descriptor and never
    through a link (a directory the job swaps for a link meanwhile is not followed), so neither
    a path's length nor the job's renames matter."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.total = self.entries = 0
        self.too_deep = False
        self.seen: set[tuple[int, int]] = set()  # (device, inode) of files with several names

    @property
    def complete(self) -> bool:
        return self.entries <= self.max_entries and not self.too_deep

    def count(self, info: os.stat_result) -> None:
        self.entries += 1
        if not stat.S_ISDIR(info.st_mode) and info.st_nlink > 1:
            key = (info.st_dev, info.st_ino)
            if key in self.seen:
                return
            self.seen.add(key)
        self.total += info.st_blocks * BLOCK_BYTES

    def root(self, root: Path) -> None:
        try:
            info = os.lstat(root)
        except OSError:
            return
        self.count(info)
        if stat.S_ISDIR(info.st_mode):
            self.tree(_open_directory(str(root), None))

    def tree(self, top: int | None) -> None:
        """Walk the directory open as ``top`` (closed here), depth first."""
        levels: list[tuple[int, _Entries]] = []
        if top is None or not _push(levels, top):
            return
        try:
            while levels and self.complete:
                parent, entries = levels[-1]
                entry = _next(entries)
                if entry is None:
                    levels.pop()
                    entries.close()
                    os.close(parent)
                    continue
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                self.count(info)
                if not stat.S_ISDIR(info.st_mode) or not self.complete:
                    continue
                if len(levels) >= MAX_DEPTH:
                    self.too_deep = True
                    break
                child = _open_directory(entry.name, parent)
                if child is not None:
                    _push(levels, child)
        finally:
            for fd, entries in levels:
                entries.close()
                os.close(fd)


def _push(levels: list[tuple[int, _Entries]], directory: int) -> bool:
    """Start reading the directory open as ``directory`` (closed when it cannot be read)."""
    try:
        levels.append((directory, os.scandir(directory)))
    except OSError:
        os.close(directory)
        return False
    return True


def disk_usage(roots: Iterable[Path], max_entries: int) -> DiskUsage:
    """What the directory trees at ``roots`` hold (the roots' own blocks too), walking at most
    ``max_entries`` entries and ``MAX_DEPTH`` levels. Entries that vanish meanwhile are
    skipped."""
    walk = _Walk(max_entries)
    for root in roots:
        if walk.complete:
            walk.root(root)
    return DiskUsage(walk.total, walk.entries, walk.complete, walk.too_deep)


def _next(entries: _Entries) -> os.DirEntry[str] | None:
    try:
        return next(entries, None)
    except OSError:  # (the directory was removed while it was read)
        return None


def _open_directory(name: str, parent: int | None) -> int | None:
    """A descriptor of the directory ``name`` (relative to ``parent``'s), never through a link;
    None when it is gone or is not a directory any more. A directory this process owns but
    cannot read (a job running as the worker's own uid may ``chmod 000`` one) gets its owner's
    read and search bits back, and is opened."""
    for attempt in range(2):
        try:
            return os.open(name, _DIRECTORY, dir_fd=parent)
        except PermissionError:
            if attempt or not _reopen(name, parent):
                return None
        except OSError:
            return None
    return None


def _reopen(name: str, parent: int | None) -> bool:
    """Give the directory ``name`` (relative to ``parent``), if this process owns it, its
    owner's read and search bits back; whether it did."""
    try:
        handle = os.open(name, os.O_PATH | _DIRECTORY, dir_fd=parent)  # (needs no permission)
    except OSError:
        return False
    try:
        info = os.fstat(handle)
        if info.st_uid != os.geteuid():
            return False
        os.chmod(f"/proc/self/fd/{handle}", stat.S_IMODE(info.st_mode) | 0o700)  # (that inode)
    except OSError:
        return False
    finally:
        os.close(handle)
    return True


def owned_bytes(root: Path, uid: int, max_entries: int) -> int:
    """What the files of ``uid`` under ``root`` hold, in its directories too (the host's
    ``/dev/shm``, for a job without one of its own), reading at most ``max_entries`` entries
    and ``MAX_DEPTH`` levels, following no link."""
    total = seen = 0
    pending = [(str(root), 0)]
    while pending and seen < max_entries:
        directory, depth = pending.pop()
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    seen += 1
                    if seen > max_entries:
                        break
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISDIR(info.st_mode) and depth < MAX_DEPTH:
                        pending.append((entry.path, depth + 1))
                    elif info.st_uid == uid and stat.S_ISREG(info.st_mode):
                        total += info.st_blocks * BLOCK_BYTES
        except OSError:
            continue
    return total


# -- the job's processes -------------------------------------------------------------------------
@dataclass(frozen=True)
class ProcessEntry:
    pid: int
    ppid: int
    started: int  # its start time (clock ticks after boot): which process the number names
    uid: int | None = None  # its real uid, when asked for


def process_table(proc: Path = Path("/proc"), *, uids: bool = False) -> list[ProcessEntry]:
    """Every live process of the machine, with its parent and start time (one ``stat`` read
    each) and, with ``uids``, its real uid (a ``status`` read more)."""
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(proc):
            if not entry.name.isdigit():
                continue
            try:
                state, ppid, started = _stat(os.path.join(entry.path, "stat"))
                uid = _real_uid(os.path.join(entry.path, "status")) if uids else None
            except (OSError, ValueError, IndexError):
                continue
            if state not in (b"Z", b"X"):
                found.append(ProcessEntry(int(entry.name), ppid, started, uid))
    return found


def _stat(path: str, directory: int | None = None) -> tuple[bytes, int, int]:
    """(state, parent PID, start time) from a ``/proc/<pid>/stat``."""
    handle = os.open(path, os.O_RDONLY, dir_fd=directory)
    with open(handle, "rb") as file:
        fields = file.read().rsplit(b")", 1)[1].split()
    return fields[0], int(fields[1]), int(fields[19])


def _real_uid(path: str) -> int:
    with open(path, "rb") as file:
        for line in file:
            if line.startswith(b"Uid:"):
                return int(line.split()[1])
    raise ValueError(f"{path}: no Uid line")


def job_processes(table: Iterable[ProcessEntry], root: int, uid: int | None) -> list[ProcessEntry]:
    """The job's processes: ``root`` and everything below it (a sandbox's processes all are:
    its PID namespace's init inherits the orphans) and, where the job has a uid of its own,
    every process of that uid and everything below them (what left the tree outside a PID
    namespace)."""
    rows = {row.pid: row for row in table}
    children: dict[int, list[int]] = {}
    for row in rows.values():
        children.setdefault(row.ppid, []).append(row.pid)
    pending = [root, *(row.pid for row in rows.values() if uid is not None and row.uid == uid)]
    found: set[int] = set()
    while pending:
        pid = pending.pop()
        if pid in found or pid not in rows:
            continue
        found.add(pid)
        pending.extend(children.get(pid, ()))
    return [rows[pid] for pid in sorted(found)]


# -- memory ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rollup:
    """What one process's ``smaps_rollup`` says, in bytes."""

    private: int  # Pss_Anon + SwapPss (the whole Pss + SwapPss without the breakdown)
    shared_memory: int  # Pss_Shmem (0 without the breakdown)


def parse_rollup(text: str) -> Rollup:
    """The figures of one ``/proc/<pid>/smaps_rollup`` (``Name:  N kB`` lines)."""
    fields: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        value = rest.split()
        if len(value) == 2 and value[1] == "kB" and value[0].isdigit():
            fields[name.strip()] = int(value[0]) * 1024
    swap = fields.get("SwapPss", 0)
    if "Pss_Anon" in fields:
        return Rollup(fields["Pss_Anon"] + swap, fields.get("Pss_Shmem", 0))
    return Rollup(fields.get("Pss", 0) + swap, 0)


@dataclass(frozen=True)
class MemoryUsage:
    bytes: int  # what the limit is compared with
    processes: int  # how many were measured
    private: int  # their anonymous and swapped pages (PSS)
    shared_memory: int  # their shared memory (PSS), or the job's /dev/shm if more


def memory_usage(processes: Iterable[ProcessEntry], shm_bytes: int) -> MemoryUsage:
    """The memory of ``processes`` (those that exited meanwhile are left out) and of a
    ``/dev/shm`` holding ``shm_bytes``."""
    private = shared = count = 0
    for process in processes:
        rollup = read_rollup(process)
        if rollup is None:
            continue
        count += 1
        private += rollup.private
        shared += rollup.shared_memory
    shared = max(shared, shm_bytes)
    return MemoryUsage(private + shared, count, private, shared)


def memory_bound(processes: Iterable[ProcessEntry], shm_bytes: int) -> int:
    """At least what :func:`memory_usage` would say, for a fraction of its cost: each process's
    resident and swapped pages (``VmRSS`` + ``VmSwap`` of ``/proc/<pid>/status``, counters the
    kernel keeps) bound its PSS, whatever it shares. Reading a ``smaps_rollup`` walks every
    mapping of the process (about 14 ms of the worker's CPU for a rank that imported torch, on
    the 2-core development machine); this reads two numbers, so a job well under its limit
    costs the worker next to nothing to watch."""
    total = shm_bytes
    for process in processes:
        text = _read_in(process, "status")
        if text is None:
            continue
        for line in text.splitlines():
            if line.startswith(("VmRSS:", "VmSwap:")):
                total += int(line.split()[1]) * 1024
    return total


def read_rollup(process: ProcessEntry, proc: Path = Path("/proc")) -> Rollup | None:
    """The process's ``smaps_rollup``; None when it has exited, or when its number now names
    another process."""
    text = _read_in(process, "smaps_rollup", proc)
    return None if text is None else parse_rollup(text)


def _read_in(process: ProcessEntry, name: str, proc: Path = Path("/proc")) -> str | None:
    """The process's ``/proc/<pid>/<name>``; None when it has exited, or when its number now
    names another process (another start time: read through one handle on its ``/proc``
    directory, which never follows the number to its next process)."""
    try:
        directory = os.open(proc / str(process.pid), os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        if _stat("stat", directory)[2] != process.started:
            return None
        handle = os.open(name, os.O_RDONLY, dir_fd=directory)
        with open(handle, encoding="ascii", errors="replace") as file:
            return file.read()
    except (OSError, ValueError, IndexError):
        return None
    finally:
        os.close(directory)


def used_bytes(path: Path) -> int:
    """What the filesystem mounted at ``path`` holds (a tmpfs: the job's ``/dev/shm``, seen
    through ``/proc/<init>/root``); 0 when it cannot be read."""
    try:
        info = os.statvfs(path)
    except OSError:
        return 0
    return (info.f_blocks - info.f_bfree) * info.f_frsize
