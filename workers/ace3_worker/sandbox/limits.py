"""The limits a job runs under: the rlimits of its processes, set by ``prlimit`` before anything
of the job starts, and the per-job figures the worker enforces while it runs
(:mod:`ace3_worker.usage_monitor`).

- memory: ``ACE3_JOB_MEMORY_BYTES`` for the job's processes together (a memory cgroup, or the
  worker's measurement), and ``RLIMIT_DATA`` per process as a backstop (heap and private
  writable mappings; unlike ``RLIMIT_AS`` it does not count the address space CUDA and glibc
  reserve without using it). A process past it gets ``MemoryError`` / an out-of-memory error
  from torch.
- disk: ``ACE3_JOB_DISK_BYTES`` and ``ACE3_JOB_MAX_FILES`` for the job's writable directories
  together (the worker's measurement), and ``RLIMIT_FSIZE`` per file as a backstop (a write past
  it fails with EFBIG: Python ignores SIGXFSZ).
- processes: ``RLIMIT_NPROC``, counted by the kernel per real uid, so per job where every job
  has its own uid (threads count too). A fork past it fails with EAGAIN.
- CPU time: ``RLIMIT_CPU`` per process, when configured (SIGXCPU past it).
- no core files (``RLIMIT_CORE`` 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ace3_control.settings import Settings


@dataclass(frozen=True)
class JobLimits:
    memory_bytes: int  # the job's processes together; also each one's RLIMIT_DATA
    max_processes: int
    cpu_seconds: int | None
    disk_bytes: int | None = None  # the job's writable directories together; each file's too
    max_files: int = 1_000_000
    check_seconds: float = 0.5  # how often the worker measures a running job
    cgroup_root: Path | None = None  # a delegated cgroup v2 directory: memory by the kernel

    @classmethod
    def from_settings(cls, settings: Settings) -> JobLimits:
        return cls(
            settings.resolved_job_memory_bytes,
            settings.job_max_processes,
            settings.job_cpu_seconds,
            disk_bytes=settings.resolved_job_disk_bytes,
            max_files=settings.job_max_files,
            check_seconds=settings.job_usage_check_seconds,
            cgroup_root=settings.job_cgroup_root,
        )

    def describe(self) -> str:
        cpu = f", {self.cpu_seconds} CPU seconds" if self.cpu_seconds else ""
        disk = f", {self.disk_bytes >> 20} MiB of files" if self.disk_bytes else ""
        how = "a memory cgroup" if self.cgroup_root else "measured"
        return (
            f"{self.memory_bytes >> 20} MiB of memory per job ({how}; also per process){disk}, "
            f"{self.max_processes} processes and threads{cpu}"
        )


def prlimit_prefix(limits: JobLimits) -> list[str]:
    """``prlimit --data=N --nproc=N [--fsize=N] [--cpu=N] --core=0 --`` (soft and hard limits
    alike)."""
    argv = [
        "prlimit",
        f"--data={limits.memory_bytes}:{limits.memory_bytes}",
        f"--nproc={limits.max_processes}:{limits.max_processes}",
        "--core=0:0",
    ]
    if limits.disk_bytes is not None:
        argv.append(f"--fsize={limits.disk_bytes}:{limits.disk_bytes}")
    if limits.cpu_seconds is not None:
        argv.append(f"--cpu={limits.cpu_seconds}:{limits.cpu_seconds + 5}")
    return [*argv, "--"]
