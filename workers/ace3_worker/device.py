"""What this worker trains on: CUDA when torch sees a GPU (probed in a subprocess), else CPU;
which devices it hands to its jobs; and how many processes of one job it can run."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

from ace3_control.capacity import Capacity
from ace3_control.settings import Settings
from ace3_worker.sandbox.gpus import DRIVER_TABLE, GpuSelectionError, gpu_device_nodes

_PROBE = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"


@functools.cache
def cuda_device_count() -> int:
    try:
        result = subprocess.run(
            [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired):
        return 0
    text = result.stdout.strip().splitlines()
    return int(text[-1]) if result.returncode == 0 and text and text[-1].isdigit() else 0


def worker_device(configured: str) -> str:
    if configured != "auto":
        return configured
    return "cuda" if cuda_device_count() > 0 else "cpu"


def visible_cuda_devices() -> tuple[str, ...]:
    """The GPUs this worker sees: its own ``CUDA_VISIBLE_DEVICES`` entries when it is given
    some, else ``0..N-1``."""
    count = cuda_device_count()
    given = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    given = [d for d in given if d]
    if given:
        return tuple(given[:count])
    return tuple(str(index) for index in range(count))


def device_pool(settings: Settings) -> tuple[str, ...] | None:
    """The devices this worker hands out, one disjoint set per running job
    (:mod:`ace3_worker.gpu_sets`): ``ACE3_WORKER_GPUS``, else on a CUDA worker every GPU it
    sees. None on a CPU worker without ``ACE3_WORKER_GPUS``: its jobs get no device list."""
    configured = settings.resolved_worker_gpus
    if configured is not None:
        return configured
    if worker_device(settings.worker_device) == "cuda":
        return visible_cuda_devices()
    return None


def device_pool_problem(
    settings: Settings, dev: Path = Path("/dev"), table: Path = DRIVER_TABLE
) -> str | None:
    """Why a CUDA worker's ``ACE3_WORKER_GPUS`` names a GPU this machine lacks (resolved as the
    sandbox resolves a job's devices: :mod:`ace3_worker.sandbox.gpus`); None when it does not,
    or on a CPU worker (where the list is only handed out)."""
    listed = settings.worker_gpus
    if listed is None or worker_device(settings.worker_device) != "cuda":
        return None
    try:
        gpu_device_nodes(listed, dev, table)
    except GpuSelectionError as exc:
        return f"ACE3_WORKER_GPUS={listed}: {str(exc).removeprefix('CUDA_VISIBLE_DEVICES: ')}"
    return None


def local_capacity(settings: Settings) -> Capacity:
    """What this worker advertises and admits: its GPUs on CUDA (its device list), else the CPU
    processes one job may run (``ACE3_WORKER_CPU_PROCESSES``, default the usable cores; no more
    than the device list when ``ACE3_WORKER_GPUS`` is set, as each rank gets a device of it)."""
    kind = worker_device(settings.worker_device)
    pool = device_pool(settings)
    if kind == "cuda":
        return Capacity("cuda", len(pool) if pool is not None else cuda_device_count())
    processes = settings.resolved_worker_cpu_processes
    return Capacity("cpu", processes if pool is None else min(processes, len(pool)))
