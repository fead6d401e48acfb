"""``ace3.MemoryProfiler``: the peak memory of training and how much of it is training state.

::

    memory_profiler = ace3.MemoryProfiler()
    memory_profiler.start()
    trainer.train(model, dataset)
    memory_stats = memory_profiler.stop()
    print(f"Peak memory usage: {memory_stats.peak_memory_mb} MB")
    print(f"Memory efficiency: {memory_stats.efficiency}%")

**Peak.** In-process training on a GPU: ``torch.cuda.max_memory_allocated`` between start and
stop (peak statistics are reset at start; the busiest GPU if there are several). Otherwise:
how far this process's resident set grew above its size at ``start()``, sampled every 5 ms
from ``/proc/self/statm`` (``resource.getrusage`` elsewhere). A remote job reports the same,
measured on its busiest rank (RSS growth above the rank's size before the model was built).

**Efficiency** = ``100 * training state / peak``, capped at 100, where the training state is
the bytes of the parameters, their gradients and the optimizer state. The rest of the peak is
activations, temporary buffers, data batches, the allocator's slack and runtime overhead; 100%
would mean memory held nothing but the state. None when no trainer reported the state (your
own loop can call :meth:`MemoryProfiler.track`).

No torch import at module level.
"""

from __future__ import annotations

import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Literal

from ace3.runtime.observe.memory_meter import MIB, RssSampler, cuda_in_use, efficiency_percent
from ace3.training.profiling.registry import ProfilingError, register, unregister


@dataclass(frozen=True)
class MemoryStats:
    """What :meth:`MemoryProfiler.stop` measured (see the module docstring for definitions).

    ``peak_memory_mb``: the peak (MiB); ``state_memory_mb``: parameters + gradients +
    optimizer state (MiB, None if unknown); ``efficiency``: ``100 * state / peak`` in percent
    (None if unknown); ``absolute_peak_mb``: the largest absolute value (GPU peak, or largest
    RSS); ``samples``: readings taken; ``device``: ``cpu`` or ``cuda``; ``source``:
    ``local`` or ``remote job <id>``.
    """

    peak_memory_mb: float
    efficiency: float | None
    state_memory_mb: float | None
    absolute_peak_mb: float
    samples: int
    device: Literal["cpu", "cuda"]
    source: str

    def __str__(self) -> str:
        state = "unknown" if self.state_memory_mb is None else f"{self.state_memory_mb:.3g} MB"
        efficiency = "unknown" if self.efficiency is None else f"{self.efficiency}%"
        return (
            f"peak {self.peak_memory_mb:.4g} MB on {self.device} ({self.source}), training state "
            f"{state}, efficiency {efficiency}, {self.samples} samples"
        )


@dataclass(frozen=True)
class _RemoteJob:
    job_id: str
    peak_memory_mb: float
    state_memory_mb: float | None
    device: Literal["cpu", "cuda"]
    samples: int
    absolute_peak_mb: float | None


def _number(name: str, value: Any, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{name} must be a number >= 0, got {value!r}")
    return float(value)


class MemoryProfiler:
    """Measure peak memory between :meth:`start` and :meth:`stop`; see the module docstring.

    Trainers find a started profiler through ``ace3.training.profiling.active_profilers()`` and report
    the training state (:meth:`note_training_state`) or a remote job's figures
    (:meth:`note_remote_job`). Remote figures, when any, replace the local measurement (this
    process only waited); with several jobs, the one with the largest peak is reported.
    """

    def __init__(self, interval_s: float = 0.005) -> None:
        self._rss = RssSampler(interval_s)
        self._lock = threading.Lock()
        self._started = False
        self._state_bytes: int | None = None
        self._tracked: list[tuple[Any, Any]] = []
        self._remote: list[_RemoteJob] = []
        self._cuda_baseline: dict[int, int] = {}

    @property
    def active(self) -> bool:
        return self._started

    def start(self) -> None:
        """Begin measuring (resets the GPU peak statistics of an initialised CUDA context)."""
        if self._started:
            raise ProfilingError("MemoryProfiler.start(): already started; call stop() first")
        register(self)
        self._state_bytes, self._tracked, self._remote = None, [], []
        self._cuda_baseline = {}
        if cuda_in_use():
            torch = sys.modules["torch"]
            for index in range(torch.cuda.device_count()):
                torch.cuda.reset_peak_memory_stats(index)
                self._cuda_baseline[index] = torch.cuda.memory_allocated(index)
        self._rss.start()
        self._started = True

    # -- what trainers report -------------------------------------------------------------
    def note_training_state(self, state_bytes: int) -> None:
        """The training state's size in bytes (``ace3.runtime.observe.state_size.training_state_bytes``
        after training); with several calls (several runs) the largest is kept."""
        if isinstance(state_bytes, bool) or not isinstance(state_bytes, int) or state_bytes < 0:
            raise ValueError(f"state_bytes must be an int >= 0, got {state_bytes!r}")
        with self._lock:
            self._state_bytes = max(self._state_bytes or 0, state_bytes)

    def track(self, model: Any, optimizer: Any = None) -> None:
        """Size ``model``'s parameters and gradients and ``optimizer``'s state at :meth:`stop`
        (for your own training loop; weak references, nothing is kept alive)."""
        if not hasattr(model, "parameters"):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if optimizer is not None and not hasattr(optimizer, "state"):
            raise TypeError(
                f"optimizer must be a torch.optim.Optimizer or None, got {type(optimizer).__name__}"
            )
        opt_ref = (lambda: None) if optimizer is None else weakref.ref(optimizer)
        with self._lock:
            self._tracked.append((weakref.ref(model), opt_ref))

    def note_remote_job(
        self,
        job_id: str,
        peak_memory_mb: float,
        state_memory_mb: float | None,
        device: Literal["cpu", "cuda"] = "cpu",
        samples: int = 0,
        absolute_peak_mb: float | None = None,
    ) -> None:
        """A finished job's figures from its summary (the engine's rank maximum)."""
        if not isinstance(job_id, str) or not job_id:
            raise ValueError(f"job_id must be a non-empty string, got {job_id!r}")
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
            raise ValueError(f"samples must be an int >= 0, got {samples!r}")
        job = _RemoteJob(
            job_id=job_id,
            peak_memory_mb=_number("peak_memory_mb", peak_memory_mb) or 0.0,
            state_memory_mb=_number("state_memory_mb", state_memory_mb, allow_none=True),
            device=device,
            samples=samples,
            absolute_peak_mb=_number("absolute_peak_mb", absolute_peak_mb, allow_none=True),
        )
        with self._lock:
            self._remote.append(job)

    def note_job_summary(self, job_id: str, summary: dict[str, Any]) -> bool:
        """:meth:`note_remote_job` from a job summary holding the fields of
        ``ace3.runtime.observe.memory_meter.memory_summary``; False (nothing noted) when the summary
        has no ``peak_memory_mb``."""
        if not isinstance(summary, dict):
            raise TypeError(f"summary must be a dict, got {type(summary).__name__}")
        if summary.get("peak_memory_mb") is None:
            return False
        self.note_remote_job(
            job_id,
            peak_memory_mb=summary["peak_memory_mb"],
            state_memory_mb=summary.get("state_memory_mb"),
            device=summary.get("memory_device") or "cpu",
            samples=int(summary.get("memory_samples") or 0),
            absolute_peak_mb=summary.get("absolute_peak_memory_mb"),
        )
        return True

    # -- the result -----------------------------------------------------------------------
    def _tracked_state_bytes(self) -> int | None:
        from ace3.runtime.observe.state_size import training_state_bytes

        sizes = []
        for model_ref, opt_ref in self._tracked:
            model = model_ref()
            if model is not None:
                sizes.append(training_state_bytes(model, opt_ref()))
        return max(sizes) if sizes else None

    def _cuda_peak(self) -> tuple[int, int] | None:
        """(peak bytes, baseline bytes) of the busiest GPU, or None when CUDA held nothing."""
        if not cuda_in_use():
            return None
        torch = sys.modules["torch"]
        best: tuple[int, int] | None = None
        for index in range(torch.cuda.device_count()):
            peak = torch.cuda.max_memory_allocated(index)
            if peak > 0 and (best is None or peak > best[0]):
                best = (peak, self._cuda_baseline.get(index, 0))
        return best

    def stop(self) -> MemoryStats:
        """Stop measuring and return the :class:`MemoryStats`."""
        if not self._started:
            raise ProfilingError(
                "MemoryProfiler.stop() called before start(): call memory_profiler.start() "
                "before training"
            )
        self._started = False
        try:
            self._rss.stop()
        finally:
            unregister(self)
        with self._lock:
            remote = list(self._remote)
        if remote:
            job = max(remote, key=lambda j: j.peak_memory_mb)
            return MemoryStats(
                peak_memory_mb=round(job.peak_memory_mb, 3),
                efficiency=efficiency_percent(job.state_memory_mb, job.peak_memory_mb),
                state_memory_mb=job.state_memory_mb,
                absolute_peak_mb=round(job.absolute_peak_mb or job.peak_memory_mb, 3),
                samples=job.samples,
                device=job.device,
                source=f"remote job {job.job_id}",
            )
        tracked = self._tracked_state_bytes()
        noted = self._state_bytes
        state_bytes = max(v for v in (noted, tracked, -1) if v is not None)
        state_mb = None if state_bytes < 0 else state_bytes / MIB
        cuda = self._cuda_peak()
        if cuda is not None:
            peak_mb = absolute_mb = cuda[0] / MIB
            device: Literal["cpu", "cuda"] = "cuda"
        else:
            peak_mb = self._rss.growth_bytes / MIB
            absolute_mb = self._rss.peak_bytes / MIB
            device = "cpu"
        return MemoryStats(
            peak_memory_mb=round(peak_mb, 3),
            efficiency=efficiency_percent(state_mb, peak_mb),
            state_memory_mb=state_mb,
            absolute_peak_mb=round(absolute_mb, 3),
            samples=self._rss.samples,
            device=device,
            source="local",
        )
