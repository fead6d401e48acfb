"""Profiling training: ``ace3.TrainingProfiler``, ``ace3.ProfilerActivity``,
``ace3.MemoryProfiler`` (see ``docs/profiling-and-data.md``).

Trainers discover the profilers a user started with :func:`active_profilers` and feed them:
in-process training runs inside the ``TrainingProfiler`` block (and reports its training state
to each ``MemoryProfiler``); a remote job carries :func:`combined_remote_spec` in its config
and its results come back through ``TrainingProfiler.load_remote`` and
``MemoryProfiler.note_remote_job``. Importing this module does not import torch.
"""

from __future__ import annotations

from ace3.training.profiling.memory import MemoryProfiler, MemoryStats
from ace3.training.profiling.profiler_options import ProfilerActivity
from ace3.training.profiling.registry import ProfilingError, active_profilers
from ace3.training.profiling.torch_profiler import (
    TrainingProfiler,
    active_training_profilers,
    combined_remote_spec,
)


def active_memory_profilers() -> list[MemoryProfiler]:
    """The started :class:`MemoryProfiler` objects, earliest first."""
    return [p for p in active_profilers() if isinstance(p, MemoryProfiler)]


__all__ = [
    "MemoryProfiler",
    "MemoryStats",
    "ProfilerActivity",
    "ProfilingError",
    "TrainingProfiler",
    "active_memory_profilers",
    "active_profilers",
    "active_training_profilers",
    "combined_remote_spec",
]
