"""The GPU checks (marked ``gpu``; tests/conftest.py skips them where torch sees no CUDA
device). Each starts from a clean device: no compiled graphs or CUDA graphs of an earlier check,
the allocator's cache emptied and its peak counters reset; and whatever a check changed of the
process's CUDA settings (TF32, the memory cap of the out-of-memory check) is put back after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def clean_device() -> Iterator[None]:
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch._dynamo.reset()  # (torch 2.13 drops the CUDA graph trees too; 2.11 may not)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn
        torch._dynamo.reset()
        torch.cuda.empty_cache()
