"""The worker's settings, read from ACE3_* variables like the rest of
:class:`ace3_control.settings.Settings` (which adds them to its own): its slots and devices,
the warm path, multi-node gangs, the job sandbox and the limits a job runs under, and what the
machine offers when they are not set (:func:`usable_cores`, :func:`physical_memory_bytes`).
"""

from __future__ import annotations

import os
import re
import socket
import tempfile
from pathlib import Path

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from ace3_control.environment_settings import EnvironmentSettings


class WorkerSettings(EnvironmentSettings):
    """What a worker, its sandbox and the jobs it runs are given."""

    model_config = SettingsConfigDict(env_prefix="ACE3_", extra="ignore")

    worker_slots: int = Field(1, ge=1, description="Jobs one worker runs at once.")
    warm_launch: bool = Field(
        True,
        description="Each worker slot keeps a job sandbox started ahead of time whose launcher "
        "has imported torch, torchrun's agent and the engine (no user code); a single-node job "
        "is handed to it and starts in about a second. false: every job starts its sandbox and "
        "torchrun when it is claimed (the cold path), e.g. to keep the memory an idle launcher "
        "holds (a few hundred MB per slot), or to rule the warm path out while diagnosing.",
    )
    worker_device: str = Field(
        "auto", pattern="^(auto|cpu|cuda)$", description="auto: cuda when torch sees a GPU."
    )
    worker_cpu_processes: int | None = Field(
        None,
        ge=1,
        description="Processes one job may run on a CPU worker (what it advertises as its "
        "capacity); default: the cores this process may use.",
    )
    worker_gpus: str | None = Field(
        None,
        description="The GPUs this worker hands to its jobs, comma-separated indices (PCI bus "
        "order, as nvidia-smi numbers them) or GPU-<uuid> values, e.g. 0,1,2,3: each running "
        "job (each node of a multi-node job) gets its own num_gpus of them as its "
        "CUDA_VISIBLE_DEVICES, never a device another running job holds. Default (unset or "
        "empty): on a CUDA worker, every GPU it sees (its own CUDA_VISIBLE_DEVICES, if set); on a "
        "CPU worker, no device list (CPU jobs are not assigned devices).",
    )
    worker_gpu_lock_dir: Path | None = Field(
        None,
        description="Where the workers of this machine lock the GPUs their running jobs hold "
        "(the same directory for every worker of the machine, so two workers sharing GPUs "
        "never hand one to two jobs); default: sandbox_lock_dir/gpus for a root worker, else "
        "<temporary directory>/ace3-gpus-<uid>.",
    )
    gang_wait_seconds: float = Field(
        300.0,
        gt=0,
        description="How long the workers that claimed nodes of a multi-node job wait for the "
        "rest of its num_nodes workers before the job fails (each holds a slot meanwhile).",
    )
    worker_advertise_host: str | None = Field(
        None,
        min_length=1,
        description="The address other workers reach this one at: the rendezvous endpoint of "
        "the multi-node jobs it leads, and torchrun's --local-addr. Default: the address this "
        "machine's hostname resolves to (127.0.0.1 when it does not resolve).",
    )
    sandbox: str = Field(
        "auto",
        pattern="^(auto|bwrap|uid|none)$",
        description="How a worker isolates the jobs it runs (docs/security.md). bwrap: "
        "bubblewrap namespaces (own PID, mount, IPC and, single-node, network namespace; only the "
        "job directory visible) and, for a worker running as root, a dedicated uid per job; uid: "
        "only the dedicated uid, rlimits and file permissions (where namespaces are not "
        "allowed; needs root); none: no isolation (your own code on your own machine only); "
        "auto: bwrap when it works here, else uid when running as root, else the worker refuses "
        "to start.",
    )
    sandbox_uid_base: int = Field(
        61000,
        ge=1000,
        le=(1 << 31) - 2,
        description="First of the uids (and gids) a root worker runs jobs as, one per running "
        "job; no account of the machine may use them.",
    )
    sandbox_uid_count: int = Field(
        64,
        ge=1,
        le=65536,
        description="How many uids from sandbox_uid_base jobs may use: one per running job and "
        "one per slot's prepared (warm) sandbox, so at least twice the slots of every worker of "
        "the machine (with fewer free, a slot prepares no sandbox and its next job starts cold).",
    )
    sandbox_lock_dir: Path = Field(
        Path("/run/ace3-sandbox"),
        description="Where workers on this machine take the locks that give each running job "
        "its own uid (must be the same directory for every worker of the machine).",
    )
    job_memory_bytes: int | None = Field(
        None,
        ge=1 << 26,
        description="Memory a job's processes may hold together: past it the worker kills the "
        "attempt ('out of memory: the job's processes used N bytes, the limit is M'; the "
        "micro-batch is halved where the out-of-memory back-off applies, else the job fails). "
        "Enforced by a memory cgroup where ACE3_JOB_CGROUP_ROOT is set, else measured by the "
        "worker (the processes' proportional set size, PSS, plus the job's /dev/shm) every "
        "ACE3_JOB_USAGE_CHECK_SECONDS. Also each process's RLIMIT_DATA and the size of the "
        "job's /dev/shm. Default: the machine's memory divided by the worker's slots.",
    )
    job_disk_bytes: int | None = Field(
        None,
        ge=1 << 20,
        description="Bytes a job's writable directories (its output, home and temporary "
        "directories) may hold together, measured as allocated blocks every "
        "ACE3_JOB_USAGE_CHECK_SECONDS (or less often while a measurement takes long): past it "
        "the attempt is killed and the job fails naming the limit, without a retry. Also each "
        "file's size limit (RLIMIT_FSIZE). Default: the space free on the work directory's "
        "filesystem when the worker starts, divided by its slots plus one (the last share is "
        "left to everything else on that filesystem).",
    )
    job_max_files: int = Field(
        1_000_000,
        ge=1000,
        description="Files and directories a job's writable directories may hold together (the "
        "disk measurement walks them all, so this bounds its cost; the filesystem's inodes are "
        "a shared resource too): past it the attempt is killed and the job fails naming the "
        "limit, without a retry.",
    )
    job_usage_check_seconds: float = Field(
        0.5,
        ge=0.05,
        le=10,
        description="How often the worker measures each running job's disk and memory; a job "
        "writing as fast as it can passes ACE3_JOB_DISK_BYTES by at most its write rate times "
        "this (plus one measurement's duration) before it is stopped.",
    )
    job_cgroup_root: Path | None = Field(
        None,
        description="A cgroup v2 directory delegated to the worker (writable by it, with the "
        "memory controller available, and holding none of the worker's own processes): each "
        "job sandbox then runs in a child cgroup of its own whose memory.max is "
        "ACE3_JOB_MEMORY_BYTES (memory.swap.max 0), enforced by the kernel. Unset: the "
        "worker's own measurement (docs/security.md).",
    )
    job_max_processes: int = Field(
        4096,
        ge=16,
        description="Processes and threads a job's uid may run at once (RLIMIT_NPROC).",
    )
    job_cpu_seconds: int | None = Field(
        None,
        ge=1,
        description="CPU seconds one process of a job may use (RLIMIT_CPU); default none.",
    )
    max_checkpoint_bytes: int = Field(
        64 << 30, ge=1, description="Largest checkpoint file a job may hand the worker."
    )
    max_log_bytes_per_job: int = Field(
        64 << 20,
        ge=1024,
        description="Log bytes one attempt of a job may store; past it lines are dropped and "
        "counted.",
    )
    max_log_lines_per_second: float = Field(
        500.0,
        gt=0,
        description="Sustained log lines per second one attempt may store (bursts of ten seconds' "
        "worth pass); past it lines are dropped and counted.",
    )
    max_log_bytes_per_second: float = Field(
        256 * 1024,
        gt=0,
        description="Sustained log bytes per second one attempt may store (bursts of ten "
        "seconds' worth pass); past it lines are dropped and counted.",
    )

    @field_validator("worker_gpus")
    @classmethod
    def _check_worker_gpus(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        try:
            return ",".join(parse_device_list(value))
        except ValueError as exc:
            raise ValueError(f"ACE3_WORKER_GPUS={value!r}: {exc}") from None

    @model_validator(mode="after")
    def _build_uid_is_no_job_uid(self) -> WorkerSettings:
        """The environment builds' uid must not be one a job runs as: a job could otherwise
        reach a build's scratch directory and the processes unpacking other owners' wheels."""
        first, last = self.sandbox_uid_base, self.sandbox_uid_base + self.sandbox_uid_count - 1
        if first <= self.env_build_uid <= last:
            raise ValueError(
                f"ACE3_ENV_BUILD_UID={self.env_build_uid} is one of the job uids "
                f"(ACE3_SANDBOX_UID_BASE..+COUNT: {first}-{last}); choose a uid outside them"
            )
        return self

    @property
    def resolved_worker_gpus(self) -> tuple[str, ...] | None:
        """ACE3_WORKER_GPUS as a tuple of device names; None when unset."""
        return None if self.worker_gpus is None else tuple(self.worker_gpus.split(","))

    @property
    def resolved_worker_gpu_lock_dir(self) -> Path:
        if self.worker_gpu_lock_dir is not None:
            return self.worker_gpu_lock_dir
        if os.geteuid() == 0:
            return self.sandbox_lock_dir / "gpus"
        return Path(tempfile.gettempdir()) / f"ace3-gpus-{os.geteuid()}"

    @property
    def resolved_worker_cpu_processes(self) -> int:
        """ACE3_WORKER_CPU_PROCESSES, else the cores this process may run on (at least 1)."""
        if self.worker_cpu_processes is not None:
            return self.worker_cpu_processes
        return max(1, usable_cores())

    @property
    def resolved_job_memory_bytes(self) -> int:
        """ACE3_JOB_MEMORY_BYTES, else the machine's memory shared by the worker's slots."""
        if self.job_memory_bytes is not None:
            return self.job_memory_bytes
        return max(1 << 30, physical_memory_bytes() // self.worker_slots)

    @property
    def resolved_worker_advertise_host(self) -> str:
        """ACE3_WORKER_ADVERTISE_HOST, else the address the hostname resolves to."""
        if self.worker_advertise_host:
            return self.worker_advertise_host
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return "127.0.0.1"


_DEVICE_NAME = re.compile(r"^(\d+|(GPU|MIG)-[A-Za-z0-9-]+)$")


def parse_device_list(value: str) -> tuple[str, ...]:
    """``"0, 1,GPU-8f2a..."`` -> ``("0", "1", "GPU-8f2a...")``: distinct CUDA device indices or
    UUIDs; a ValueError naming the bad entry otherwise."""
    devices = tuple(part.strip() for part in value.split(","))
    for device in devices:
        if not _DEVICE_NAME.match(device):
            raise ValueError(
                f"{device!r} is not a GPU index or UUID: give comma-separated indices or "
                "GPU-<uuid> values, e.g. 0,1,2,3"
            )
    normalised = tuple(str(int(d)) if d.isdigit() else d for d in devices)
    repeated = sorted({d for d in normalised if normalised.count(d) > 1})
    if repeated:
        raise ValueError(f"GPU {', '.join(repeated)} is listed more than once")
    return normalised


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def disk_share_bytes(path: Path, slots: int) -> int:
    """One job's default share of the filesystem holding ``path`` (or its nearest existing
    parent): its size divided by ``slots`` plus one, at least 1 MiB. Its size, not what is free:
    each worker slot reads this when its process starts, and a share of what is free then (other
    slots' jobs already writing, a slot's process restarted on a fuller disk) could come out
    tiny, failing every job of that slot without a retry."""
    while not path.exists() and path.parent != path:
        path = path.parent
    stats = os.statvfs(path)
    return max(1 << 20, stats.f_blocks * stats.f_frsize // (slots + 1))


def physical_memory_bytes() -> int:
    """The machine's memory (what the sandbox's default per-process limit is derived from)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 16 << 30
