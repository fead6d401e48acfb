"""Which profilers are active right now, so a trainer can find them without being passed them.

``with ace3.TrainingProfiler(...): trainer.train(...)`` and ``MemoryProfiler.start()`` register
the profiler here; leaving the block or ``stop()`` removes it. Trainers ask
:func:`active_profilers` when they start (local) or submit (remote) a run. The registry is
process-wide (a profiler entered on one thread sees training started on another) and
thread-safe; profilers may nest, and are listed outermost first.
"""

from __future__ import annotations

import threading
from typing import Any

from ace3.errors import ACE3Error

_lock = threading.Lock()
_active: list[Any] = []


class ProfilingError(RuntimeError, ACE3Error):
    """A profiler was used out of order (results asked for before anything was profiled,
    ``stop()`` without ``start()``, a profiler entered twice)."""


def register(profiler: Any) -> None:
    with _lock:
        if any(p is profiler for p in _active):
            raise ProfilingError(
                f"this {type(profiler).__name__} is already active; leave its with-block "
                "(or stop() it) before starting it again, or use a second instance"
            )
        _active.append(profiler)


def unregister(profiler: Any) -> None:
    with _lock:
        for i, p in enumerate(_active):
            if p is profiler:
                del _active[i]
                return


def active_profilers() -> list[Any]:
    """A snapshot of the active ``TrainingProfiler`` and ``MemoryProfiler`` objects,
    outermost (earliest started) first."""
    with _lock:
        return list(_active)
