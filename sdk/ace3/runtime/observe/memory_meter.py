"""Peak memory of a training run: GPU allocator peaks or the process's resident-set peak.

Used twice: by the engine on every rank of a job (:class:`PeakMemoryMeter`, whose readings go
into the job summary) and by ``ace3.MemoryProfiler`` around in-process training (which reuses
:class:`RssSampler`). The CPU side reads the resident set size (RSS) of this process: on Linux
the kernel's own high-water mark (``VmHWM`` in ``/proc/self/status``, reset at start through
``/proc/self/clear_refs``), exact and with nothing running in between; where that reset is not
allowed, ``/proc/self/statm`` sampled on a background thread every few milliseconds (a thread
that competes with training for the CPU: a few percent of a step on a busy machine); elsewhere
the kernel's lifetime maximum from ``resource.getrusage`` (exact for a new maximum, blind to
peaks below an earlier one). The GPU side reads ``torch.cuda.max_memory_allocated`` (reset at start):
what tensors held at the worst moment, not counting the allocator's cache or CUDA's context.

``training_state_bytes`` (:mod:`ace3.runtime.observe.state_size`) sizes what training must
keep; ``ace3.MemoryProfiler`` divides it by the peak to report its ``efficiency``
(:func:`efficiency_percent`).

No torch import at module level: the plain SDK imports :class:`RssSampler` without torch.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

MIB = 1024 * 1024
DEFAULT_INTERVAL_S = 0.005
_STATM = Path("/proc/self/statm")
_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
# Samplers reading the high-water mark in this process: a reset (another sampler starting)
# first hands each of them the peak so far, so none loses what it measured.
_HWM_SAMPLERS: weakref.WeakSet[RssSampler] = weakref.WeakSet()
_HWM_LOCK = threading.Lock()


def _page_size() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return 4096


def _statm_rss_bytes() -> int | None:
    """This process's resident set now (bytes), or None where /proc is missing."""
    try:
        fields = _STATM.read_bytes().split()
    except OSError:
        return None
    return int(fields[1]) * _page_size()


def _hwm_bytes() -> int | None:
    """The resident-set high-water mark of this process (``VmHWM``, bytes), or None."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def _reset_hwm() -> bool:
    """Set the high-water mark to the current RSS (Linux >= 4.0); False where not allowed.
    The samplers already reading it take their peak so far first."""
    for sampler in list(_HWM_SAMPLERS):
        sampler.sample()
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def _max_rss_bytes() -> int:
    """The kernel's lifetime maximum resident set of this process (bytes)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # macOS: bytes, else KiB


class RssSampler:
    """Tracks the peak resident set size of this process between :meth:`start` and
    :meth:`stop`: the kernel's high-water mark where it can be reset (``method`` ``hwm``:
    exact, no thread), else sampling on a daemon thread every ``interval_s`` seconds.

    ``baseline_bytes`` is the RSS at start; ``peak_bytes`` the largest reading (at least the
    baseline); ``samples`` how many readings were taken. When sampling, peaks shorter than the
    interval can be missed; a final reading is taken at stop.
    """

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        if not isinstance(interval_s, (int, float)) or not 0.0 < interval_s <= 10.0:
            raise ValueError(f"interval_s must be a number in (0, 10] seconds, got {interval_s!r}")
        self.interval_s = float(interval_s)
        self.method: Literal["hwm", "statm", "getrusage"] = (
            "statm" if _statm_rss_bytes() is not None else "getrusage"
        )
        self.baseline_bytes = 0
        self.peak_bytes = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def running(self) -> bool:
        return self._thread is not None or self in _HWM_SAMPLERS

    def _read(self) -> int:
        if self.method == "hwm":
            value = _hwm_bytes()
            if value is not None:
                return value
        if self.method in ("hwm", "statm"):
            value = _statm_rss_bytes()
            if value is not None:
                return value
        return _max_rss_bytes()

    def sample(self) -> None:
        value = self._read()
        with self._lock:
            self.samples += 1
            self.peak_bytes = max(self.peak_bytes, value)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def start(self) -> None:
        if self.running:
            raise RuntimeError("RssSampler.start(): already started; call stop() first")
        with _HWM_LOCK:
            if self.method != "getrusage" and _hwm_bytes() is not None and _reset_hwm():
                self.method = "hwm"
                self.baseline_bytes = self.peak_bytes = _statm_rss_bytes() or self._read()
                self.samples = 1
                _HWM_SAMPLERS.add(self)
                return
        if self.method == "hwm":  # (a reset allowed before is refused now)
            self.method = "statm"
        if self.method == "statm":
            self.baseline_bytes = self._read()
        else:
            # getrusage only knows the lifetime maximum: growth is measured above it.
            self.baseline_bytes = _max_rss_bytes()
        self.peak_bytes = self.baseline_bytes
        self.samples = 1
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="ace3-rss-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if not self.running:
            raise RuntimeError("RssSampler.stop(): not started; call start() first")
        if self._thread is None:  # the high-water mark: one last reading
            with _HWM_LOCK:
                self.sample()
                _HWM_SAMPLERS.discard(self)
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self.sample()

    @property
    def growth_bytes(self) -> int:
        return max(0, self.peak_bytes - self.baseline_bytes)


def cuda_in_use() -> bool:
    """True when this process has initialised CUDA (never initialises it itself)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_initialized())
    except Exception:
        return False


@dataclass(frozen=True)
class MemoryReading:
    """One rank's (or one process's) peak memory between start and stop.

    ``peak_memory_mb`` is what a report should show: on ``cuda`` the allocator's peak
    (``max_memory_allocated``, absolute); on ``cpu`` the resident-set growth above the size
    at start. ``absolute_peak_mb`` is the largest absolute value (GPU peak, or the largest
    RSS); ``baseline_mb`` the value at start (GPU memory allocated, or RSS).
    """

    device: Literal["cpu", "cuda"]
    peak_memory_mb: float
    absolute_peak_mb: float
    baseline_mb: float
    samples: int
    method: str  # "cuda_max_memory_allocated", "hwm", "statm" or "getrusage"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class PeakMemoryMeter:
    """The peak memory of one rank of a job: start before the model is built, stop after
    training (also after a failure).

    ``device`` is the rank's torch device (or its type): ``cuda`` measures the allocator peak
    of that GPU (reset at start); anything else samples this process's RSS every
    ``interval_s`` seconds. RSS is always sampled too, so :meth:`stop` can report it for
    GPU runs in ``cpu_reading``.
    """

    def __init__(self, device: Any = "cpu", interval_s: float = DEFAULT_INTERVAL_S) -> None:
        kind = getattr(device, "type", device)
        if kind not in ("cpu", "cuda", "mps", "xpu", "meta"):
            raise ValueError(f"device must be a torch.device or 'cpu'/'cuda', got {device!r}")
        self.device = device
        self.kind: Literal["cpu", "cuda"] = "cuda" if kind == "cuda" else "cpu"
        self.rss = RssSampler(interval_s)
        self._cuda_baseline = 0
        self._started = False
        self._final: MemoryReading | None = None
        self.cpu_reading: MemoryReading | None = None

    def start(self) -> None:
        if self._started:
            raise RuntimeError("PeakMemoryMeter.start(): already started; call stop() first")
        self._final = self.cpu_reading = None
        if self.kind == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)
            self._cuda_baseline = torch.cuda.memory_allocated(self.device)
        self.rss.start()
        self._started = True

    def _readings(self) -> tuple[MemoryReading, MemoryReading]:
        """(the reading to report, the RSS reading) as of now."""
        rss = self.rss
        cpu = MemoryReading(
            device="cpu",
            peak_memory_mb=rss.growth_bytes / MIB,
            absolute_peak_mb=rss.peak_bytes / MIB,
            baseline_mb=rss.baseline_bytes / MIB,
            samples=rss.samples,
            method=rss.method,
        )
        if self.kind != "cuda":
            return cpu, cpu
        import torch

        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        gpu = MemoryReading(
            device="cuda",
            peak_memory_mb=peak / MIB,
            absolute_peak_mb=peak / MIB,
            baseline_mb=self._cuda_baseline / MIB,
            samples=rss.samples,
            method="cuda_max_memory_allocated",
        )
        return gpu, cpu

    def reading(self) -> MemoryReading:
        """The peak so far, without stopping (takes one fresh RSS sample)."""
        if not self._started:
            raise RuntimeError("PeakMemoryMeter.reading(): not started; call start() first")
        self.rss.sample()
        return self._readings()[0]

    def peak_bytes(self) -> int:
        """``reading().peak_memory_mb`` in bytes: the GPU allocator's peak, or the RSS growth."""
        return round(self.reading().peak_memory_mb * MIB)

    def stop(self) -> MemoryReading:
        """Stop sampling; the final reading (the RSS one also in ``cpu_reading``). Safe to call
        again: later calls return the same reading."""
        if not self._started:
            if self._final is not None:
                return self._final
            raise RuntimeError("PeakMemoryMeter.stop(): not started; call start() first")
        self._started = False
        self.rss.stop()
        self._final, self.cpu_reading = self._readings()
        return self._final


def max_over_ranks(reading: MemoryReading, device: Any) -> MemoryReading:
    """The reading of the rank with the largest peak (a collective: call on every rank at the
    same point; ``device`` is where the process group's tensors live). Without an initialised
    process group, ``reading`` itself."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return reading
    values = torch.tensor(
        [reading.peak_memory_mb, reading.absolute_peak_mb, reading.baseline_mb,
         float(reading.samples)],
        dtype=torch.float64, device=device,
    )  # fmt: skip
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    peak, absolute, baseline, samples = values.tolist()
    return MemoryReading(
        device=reading.device,
        peak_memory_mb=peak,
        absolute_peak_mb=absolute,
        baseline_mb=baseline,
        samples=int(samples),
        method=reading.method,
    )


def efficiency_percent(state_mb: float | None, peak_mb: float) -> float | None:
    """The share of the peak that the training state accounts for, in percent (0-100]:
    ``100 * state / peak`` to 3 significant digits, capped at 100 (a state built before measuring began is not in an
    RSS growth). None when either is unknown or the peak is zero."""
    if state_mb is None or state_mb <= 0 or peak_mb <= 0:
        return None
    return float(f"{min(100.0, 100.0 * state_mb / peak_mb):.3g}")  # 3 significant digits


def memory_summary(reading: MemoryReading, state_bytes: int | None) -> dict[str, Any]:
    """The job-summary fields for a (rank-maximum) reading and the training state's size."""
    state_mb = None if state_bytes is None else state_bytes / MIB
    return {
        "peak_memory_mb": round(reading.peak_memory_mb, 3),
        "absolute_peak_memory_mb": round(reading.absolute_peak_mb, 3),
        "state_memory_mb": state_mb,
        "memory_efficiency": efficiency_percent(state_mb, reading.peak_memory_mb),
        "memory_device": reading.device,
        "memory_samples": reading.samples,
    }
