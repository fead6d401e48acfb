"""What this worker trains on: CUDA when torch sees a GPU (probed in a subprocess), else CPU."""

from __future__ import annotations

import functools
import subprocess
import sys

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
