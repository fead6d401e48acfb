"""The rlimits of a job's processes, set by ``prlimit`` before anything of the job starts.

- memory: ``RLIMIT_DATA`` per process (heap and private writable mappings; unlike
  ``RLIMIT_AS`` it does not count the address space CUDA and glibc reserve without using it).
  A process past it gets ``MemoryError`` / an out-of-memory error from torch.
- processes: ``RLIMIT_NPROC``, counted by the kernel per real uid, so per job where every job
  has its own uid (threads count too). A fork past it fails with EAGAIN.
- CPU time: ``RLIMIT_CPU`` per process, when configured (SIGXCPU past it).
- no core files (``RLIMIT_CORE`` 0).
"""

from __future__ import annotations

from dataclasses import dataclass

from ace3_control.settings import Settings


@dataclass(frozen=True)
class JobLimits:
    memory_bytes: int
    max_processes: int
    cpu_seconds: int | None

    @classmethod
    def from_settings(cls, settings: Settings) -> JobLimits:
        return cls(
            settings.resolved_job_memory_bytes,
            settings.job_max_processes,
            settings.job_cpu_seconds,
        )

    def describe(self) -> str:
        cpu = f", {self.cpu_seconds} CPU seconds" if self.cpu_seconds else ""
        return (
            f"{self.memory_bytes >> 20} MiB per process, {self.max_processes} processes and "
            f"threads{cpu}"
        )


def prlimit_prefix(limits: JobLimits) -> list[str]:
    """``prlimit --data=N --nproc=N [--cpu=N] --core=0 --`` (soft and hard limits alike)."""
    argv = [
        "prlimit",
        f"--data={limits.memory_bytes}:{limits.memory_bytes}",
        f"--nproc={limits.max_processes}:{limits.max_processes}",
        "--core=0:0",
    ]
    if limits.cpu_seconds is not None:
        argv.append(f"--cpu={limits.cpu_seconds}:{limits.cpu_seconds + 5}")
    return [*argv, "--"]
