"""What this worker trains on: CUDA when torch sees a GPU (probed in a subprocess), else CPU;
and how many processes of one job it can run."""

from __future__ import annotations

import functools
import subprocess
import sys

from ace3_control.capacity import Capacity
from ace3_control.settings import Settings

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


def local_capacity(settings: Settings) -> Capacity:
    """What this worker advertises and admits: its GPUs on CUDA, else the CPU processes one job
    may run (``ACE3_WORKER_CPU_PROCESSES``, default the usable cores)."""
    kind = worker_device(settings.worker_device)
    if kind == "cuda":
        return Capacity("cuda", cuda_device_count())
    return Capacity("cpu", settings.resolved_worker_cpu_processes)
