"""What every training-metrics report adds to the loss and the rate: the gradient norm, the
throughput in tokens and each rank's memory, step time and GPU utilisation, so a slow or
memory-hungry rank shows.

Gathered at report steps only: one ``all_gather`` of a few numbers per rank (every rank calls
:meth:`RunMetrics.report` at the same report). Nothing here runs per step; the step runner
keeps two counters (its busy time and the token ids it ran: :func:`ace3.runtime.loop.steps.count_tokens`).

Metrics (names are the events contract's: 1-200 characters, at most 256 in a report):

- ``grad_norm``: the global gradient norm of the step just reported (unscaled, before
  clipping); absent when that step's gradients were not measured (a callback stopped the
  run between reports);
- ``lr_scale``: the learning-rate factor the instability guard's rollbacks left (when not 1);
- ``tokens_per_sec``: token ids of every data replica over the wall time since the last
  report, when the inputs are token ids (see ``count_tokens``; absent otherwise); the same
  count adds up in ``TrainState.trained_tokens`` (the summary's ``trained_tokens``);
- ``data_wait_ms_rank<r>`` (while the job has at most :data:`MAX_RANKS_SHOWN` ranks) and
  ``data_wait_ms_max``: the rank's host time waiting for its next batches (the loop's
  ``next()`` on its loader: reading and collating them with ``num_workers=0``, waiting for
  the loader workers otherwise, and on a streamed dataset for shards not yet in place),
  averaged over the steps since the last report; beside ``step_time_ms`` it says what share
  of a step goes to data;
- ``memory_mb_rank<r>``, ``step_time_ms_rank<r>``, ``gpu_util_rank<r>`` for each rank while
  the job has at most :data:`MAX_RANKS_SHOWN` ranks; always ``memory_mb_max`` (and
  ``memory_mb_max_rank``, the rank that holds it), ``peak_memory_mb_max``,
  ``step_time_ms_max`` (and ``step_time_ms_max_rank``), ``step_time_ms_min``, and on GPUs with
  NVML ``gpu_util_min`` / ``gpu_util_mean``. So a 1024-rank job reports a bounded number of
  series. Memory: the CUDA allocator's ``memory_allocated`` (peak: ``max_memory_allocated``)
  on GPUs, the process's resident set size on CPUs (peak: ``ru_maxrss``). Step time: the
  rank's host time inside its optimizer steps (forward, backward, optimizer; without data
  loading), averaged over the steps since the last report; on GPUs it includes what the host
  waits for the device (collectives, the guard's or the loss scaler's reads) but not work still
  queued. GPU utilisation: NVML's percentage of the last sample period (``nvidia-ml-py``'s
  ``pynvml``), left out silently when it cannot be imported or queried.
"""

from __future__ import annotations

import resource
import sys
import time
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ace3.runtime.observe.memory_meter import _statm_rss_bytes
from ace3.runtime.process.distributed import DistContext

if TYPE_CHECKING:
    from ace3.config import TrainingConfig
    from ace3.runtime.loop.steps import StepRunner
    from ace3.runtime.loop.train_state import TrainState

MAX_RANKS_SHOWN = 8  # ranks reported one by one; more: max / min / mean only
_MB = float(1 << 20)


class _Nvml:
    """This rank's GPU in NVML (by UUID: NVML numbers every GPU of the machine, CUDA only the
    visible ones); None where NVML is missing or fails."""

    def __init__(self, device: torch.device) -> None:
        self.handle: Any = None
        self.pynvml: Any = None
        if device.type != "cuda":
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            uuid = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
            self.handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            self.pynvml = pynvml
        except Exception:  # no NVML (a CPU image, a container without the driver's library)
            self.handle = None

    def utilisation(self) -> float:
        if self.handle is None:
            return -1.0
        try:
            return float(self.pynvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)
        except Exception:
            return -1.0


def _memory_mb(device: torch.device) -> tuple[float, float]:
    """(now, peak) in MiB: the CUDA allocator's, or the process's resident set."""
    if device.type == "cuda":
        return (
            torch.cuda.memory_allocated(device) / _MB,
            torch.cuda.max_memory_allocated(device) / _MB,
        )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak_bytes = peak if sys.platform == "darwin" else peak * 1024
    now = _statm_rss_bytes() or peak_bytes
    return now / _MB, peak_bytes / _MB


class RunMetrics:
    """The report's extra figures (see the module docstring)."""

    def __init__(self, ctx: DistContext, replicas: int) -> None:
        self.ctx, self.replicas = ctx, replicas
        self.nvml = _Nvml(ctx.device)
        self.since = time.perf_counter()
        self.steps_at_report = 0
        self.data_wait = 0.0  # seconds waiting for batches since the last report (the loop's)

    def report(self, runner: StepRunner, state: TrainState) -> dict[str, float]:
        """The figures of the span since the last report (a collective on every rank)."""
        values: dict[str, float] = {}
        if runner.grad_norm is not None and runner.grad_norm_step == state.step:
            values["grad_norm"] = float(runner.grad_norm)
        if state.lr_scale != 1.0:
            values["lr_scale"] = state.lr_scale
        now = time.perf_counter()
        elapsed, self.since = max(now - self.since, 1e-9), now
        steps = max(state.step - self.steps_at_report, 1)
        self.steps_at_report = state.step
        memory, peak = _memory_mb(self.ctx.device)
        busy, tokens_run = runner.take_span()
        waited, self.data_wait = self.data_wait, 0.0
        unbanked, runner.unbanked_tokens = runner.unbanked_tokens, 0
        mine = [memory, peak, 1000.0 * busy / steps, self.nvml.utilisation(), float(tokens_run),
                1000.0 * waited / steps, float(unbanked)]  # fmt: skip
        table = torch.tensor(mine, dtype=torch.float64, device=self.ctx.device)
        if self.ctx.world_size > 1:
            gathered = [torch.empty_like(table) for _ in range(self.ctx.world_size)]
            dist.all_gather(gathered, table)
            table = torch.stack(gathered)
        rows = table.reshape(self.ctx.world_size, -1).tolist()
        values.update(per_rank_values([row[:5] for row in rows]))
        values.update(data_wait_values([row[5] for row in rows]))
        tokens = sum(row[4] for row in rows)
        if tokens > 0:  # every rank of a data replica ran the same tokens: count them once
            values["tokens_per_sec"] = tokens * self.replicas / self.ctx.world_size / elapsed
        state.trained_tokens += round(
            sum(row[6] for row in rows) * self.replicas / self.ctx.world_size
        )
        return values

    def bank_tokens(self, runner: StepRunner, state: TrainState) -> None:
        """Add the token ids run since the last report or save to ``state.trained_tokens``
        before a checkpoint records it (a collective on every rank), so a resumed run's count
        misses none; the rate's span is left as it is."""
        unbanked, runner.unbanked_tokens = runner.unbanked_tokens, 0
        total = torch.tensor([float(unbanked)], dtype=torch.float64, device=self.ctx.device)
        if self.ctx.world_size > 1:
            dist.all_reduce(total)
        state.trained_tokens += round(float(total.item()) * self.replicas / self.ctx.world_size)


def reports_after(
    state: TrainState, config: TrainingConfig, batches_per_epoch: int, group: int
) -> bool:
    """Whether the loop reports training metrics after its coming step (of ``group`` loader
    batches), so the step keeps its gradient norm for the report."""
    step = state.step + 1
    return (
        step == 1
        or step % config.log_interval == 0
        or step == config.max_steps
        or state.batch_in_epoch + group >= batches_per_epoch
    )


def per_rank_values(rows: list[list[float]]) -> dict[str, float]:
    """The report's names for each rank's [memory, peak memory, step time, GPU utilisation
    (-1: unknown), tokens] (see the module docstring)."""
    values: dict[str, float] = {}
    memory = [row[0] for row in rows]
    times = [row[2] for row in rows]
    utils = [row[3] for row in rows if row[3] >= 0]
    if len(rows) <= MAX_RANKS_SHOWN:
        for rank, row in enumerate(rows):
            values[f"memory_mb_rank{rank}"] = row[0]
            values[f"step_time_ms_rank{rank}"] = row[2]
            if row[3] >= 0:
                values[f"gpu_util_rank{rank}"] = row[3]
    values["memory_mb_max"] = max(memory)
    values["memory_mb_max_rank"] = float(memory.index(max(memory)))
    values["peak_memory_mb_max"] = max(row[1] for row in rows)
    values["step_time_ms_max"] = max(times)
    values["step_time_ms_max_rank"] = float(times.index(max(times)))
    values["step_time_ms_min"] = min(times)
    if utils:
        values["gpu_util_min"] = min(utils)
        values["gpu_util_mean"] = sum(utils) / len(utils)
    return values


def data_wait_values(waits: list[float]) -> dict[str, float]:
    """The report's names for each rank's mean wait for data per step, in ms (see the module
    docstring)."""
    values: dict[str, float] = {}
    if len(waits) <= MAX_RANKS_SHOWN:
        values = {f"data_wait_ms_rank{rank}": wait for rank, wait in enumerate(waits)}
    values["data_wait_ms_max"] = max(waits)
    return values
