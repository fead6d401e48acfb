"""Data loading: ``ace3.DataLoader``, ``ace3.DataLoaderProfiler``, ``ace3.optimize_dataloader``
(see ``docs/profiling-and-data.md``).

This module imports torch; ``ace3`` exposes its names lazily, on first use.
"""

from __future__ import annotations

from ace3.training.data.loader import DataLoader, DataLoaderOptions, usable_cpu_count
from ace3.training.data.profiling import DataLoaderProfiler, DataLoaderReport, optimize_dataloader

__all__ = [
    "DataLoader",
    "DataLoaderOptions",
    "DataLoaderProfiler",
    "DataLoaderReport",
    "optimize_dataloader",
    "usable_cpu_count",
]
