"""The per-job disk and memory limits, enforced while an attempt runs: two threads of the
attempt's own (:class:`UsageMonitor`) measure the job (:mod:`ace3_worker.job_usage`) and, the
first time it is past a limit, hand the reason to the attempt, which kills the sandbox at once
(:func:`ace3_worker.watch.kill_for`). Threads, not the watch loop's passes: a pass can wait on
the database for seconds, and the bounds below must not.

- **Disk** (``ACE3_JOB_DISK_BYTES``, ``ACE3_JOB_MAX_FILES``): the blocks the job's output, home
  and temporary directories hold, measured every ``ACE3_JOB_USAGE_CHECK_SECONDS``, or, when a
  walk takes long (a job with very many files), ``DISK_WALK_SPACING`` times the last walk's
  duration after it (the walks then take at most a fifth of a core). A job writing at rate R
  is stopped having written at most R x (interval + one walk) past the limit. The job fails,
  not retried: it would do the same again. So does a job whose directories nest deeper than
  the walk goes (``job_usage.MAX_DEPTH``): what it holds there could not be measured.
- **Memory** (``ACE3_JOB_MEMORY_BYTES``): with a memory cgroup (``ACE3_JOB_CGROUP_ROOT``) the
  kernel holds the job to it, and the thread only reads ``memory.events`` for an OOM kill;
  otherwise the thread sums the PSS of the sandbox's processes and its ``/dev/shm`` every
  interval. Past the limit the job is killed with "out of memory: the job's processes used N
  bytes, the limit is M", and the out-of-memory back-off (half the micro-batch) applies where it
  does for a rank that ran out of memory. Each process's ``RLIMIT_DATA`` stays as a backstop
  against an allocation faster than the interval.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ace3_worker.deleted_files import open_deleted_bytes
from ace3_worker.job_dir import JobDirectory
from ace3_worker.job_usage import (
    MAX_DEPTH,
    ProcessEntry,
    disk_usage,
    job_processes,
    memory_bound,
    memory_usage,
    owned_bytes,
    process_table,
)
from ace3_worker.sandbox.launch import SandboxedProcess
from ace3_worker.sandbox.limits import JobLimits

logger = logging.getLogger(__name__)

# A disk walk waits at least this many times the last one's duration before the next.
DISK_WALK_SPACING = 4.0
HOST_SHM = Path("/dev/shm")
# Entries of the host's /dev/shm read for a job without a /dev/shm of its own (uid sandbox).
MAX_HOST_SHM_ENTRIES = 100_000

# (the reason, whether it is the memory limit)
OnLimit = Callable[[str, bool], None]


def disk_reason(used: int, limit: int) -> str:
    return (
        f"the job's files passed ACE3_JOB_DISK_BYTES: its output, home and temporary "
        f"directories held {used} bytes, the limit is {limit}"
    )


def files_reason(limit: int) -> str:
    return (
        f"the job's files passed ACE3_JOB_MAX_FILES: its output, home and temporary "
        f"directories held more than {limit} files and directories"
    )


def depth_reason() -> str:
    return (
        f"the job's files could not be measured: its output, home and temporary directories "
        f"nest directories more than {MAX_DEPTH} deep"
    )


def memory_reason(used: int, limit: int) -> str:
    return (
        f"out of memory: the job's processes used {used} bytes, the limit is {limit} "
        "(ACE3_JOB_MEMORY_BYTES)"
    )


class UsageMonitor:
    """Measures one attempt's disk and memory until it is stopped; calls ``on_limit`` once,
    for the first limit the job passes."""

    def __init__(
        self,
        limits: JobLimits,
        directory: JobDirectory,
        process: SandboxedProcess,
        uid: int | None,
        on_limit: OnLimit,
    ) -> None:
        """``uid``: the job's own uid (None: it shares the worker's)."""
        self.limits = limits
        self.roots = (directory.output_dir, directory.home_dir, directory.tmp_dir)
        self.process = process
        self.uid = uid
        self.on_limit = on_limit
        self.peak_disk = self.peak_memory = 0  # what the measurements saw (for the log)
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._fired = False
        self._threads: list[threading.Thread] = []

    def start(self) -> UsageMonitor:
        targets: list[tuple[Callable[[], None], str]] = [(self._watch_memory, "ace3-memory")]
        if self.limits.disk_bytes is not None:
            targets.append((self._watch_disk, "ace3-disk"))
        for target, name in targets:
            thread = threading.Thread(target=target, daemon=True, name=name)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        """Stop measuring (the attempt's processes are gone), then read the memory cgroup's
        events once more: an OOM kill just before torchrun exited is the reason it did."""
        self._done.set()
        for thread in self._threads:
            thread.join()
        self.check_cgroup()

    # -- one measurement each ----------------------------------------------------------------
    def check_disk(self) -> float:
        """Measure the job's files once, and act on a limit; how long the walk took."""
        assert self.limits.disk_bytes is not None
        started = time.monotonic()
        usage = disk_usage(self.roots, self.limits.max_files)
        held = open_deleted_bytes(self._processes(), self._devices())
        took = time.monotonic() - started
        used = usage.bytes + held
        self.peak_disk = max(self.peak_disk, used)
        if self._done.is_set():
            return took  # (the processes ended meanwhile: the run's own outcome stands)
        if usage.too_deep:
            self._limit(depth_reason(), out_of_memory=False)
        elif not usage.complete:
            self._limit(files_reason(self.limits.max_files), out_of_memory=False)
        elif used > self.limits.disk_bytes:
            self._limit(disk_reason(used, self.limits.disk_bytes), out_of_memory=False)
        return took

    def check_memory(self) -> None:
        """Measure the job's processes once (while the sandbox's first process is unreaped:
        its number is the job's), and act on the limit."""
        if self.process.cgroup is not None:
            self.check_cgroup()
            return
        if self.process.returncode is not None:
            return
        processes = self._processes()
        shm = self.process.shm_bytes()
        if shm is None and self.uid is not None:  # (the host's /dev/shm: its files of the job)
            shm = owned_bytes(HOST_SHM, self.uid, MAX_HOST_SHM_ENTRIES)
        if memory_bound(processes, shm or 0) <= self.limits.memory_bytes:
            return  # (well under the limit: no need for the PSS, which costs the worker more)
        usage = memory_usage(processes, shm or 0)
        if self.process.returncode is not None:
            return  # (reaped meanwhile: the numbers may no longer be the job's)
        self.peak_memory = max(self.peak_memory, usage.bytes)
        if usage.bytes > self.limits.memory_bytes:
            self._limit(memory_reason(usage.bytes, self.limits.memory_bytes), out_of_memory=True)

    def _processes(self) -> list[ProcessEntry]:
        """The job's processes now (none once its first process was reaped)."""
        if self.process.returncode is not None:
            return []
        # (in a PID namespace every process of the job is below its first; outside one, a
        # process of the job's uid may have left the tree)
        uid = self.uid if self.process.plan.mode == "uid" else None
        return job_processes(process_table(uids=uid is not None), self.process.pid, uid)

    def _devices(self) -> set[int]:
        """The filesystems the job's directories are on."""
        devices = set()
        for root in self.roots:
            with contextlib.suppress(OSError):
                devices.add(os.stat(root).st_dev)
        return devices

    def check_cgroup(self) -> None:
        """The kernel's OOM killer took a process of the sandbox's memory cgroup."""
        cgroup = self.process.cgroup
        if cgroup is not None and cgroup.oom_kills() > 0:
            used = max(cgroup.peak_bytes(), cgroup.memory_bytes)
            self._limit(memory_reason(used, cgroup.memory_bytes), out_of_memory=True)

    # -- the threads -----------------------------------------------------------------------------
    def _watch_disk(self) -> None:
        delay = 0.0
        while not self._done.wait(delay) and not self._fired:
            try:
                took = self.check_disk()
            except Exception:  # (a measurement never takes the attempt down: the next one)
                logger.exception("could not measure a job's files")
                took = 0.0
            delay = max(self.limits.check_seconds, took * DISK_WALK_SPACING)

    def _watch_memory(self) -> None:
        delay = self.limits.check_seconds
        while not self._done.wait(delay) and not self._fired:
            started = time.monotonic()
            try:
                self.check_memory()
            except Exception:
                logger.exception("could not measure a job's memory")
            # (a job of many processes with many mappings makes a pass slow: it is the worker's
            # CPU, so passes are spaced as the disk walks are)
            took = time.monotonic() - started
            delay = max(self.limits.check_seconds, took * DISK_WALK_SPACING)

    def _limit(self, reason: str, *, out_of_memory: bool) -> None:
        with self._lock:
            if self._fired:
                return
            self._fired = True
        self.on_limit(reason, out_of_memory)
