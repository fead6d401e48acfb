"""How many loader batches an optimizer step takes, and batch-size growth
(``dynamic_batch_size=ace3.DynamicBatchSizeConfig(...)``, :mod:`ace3.config.batch_growth`).

The training loop asks its plan (``Components.batch_plan``) before every step:
:class:`AccumulationPlan` (no growth) takes ``gradient_accumulation_steps`` loader batches and
runs them as as many micro-batches. :class:`BatchGrowth` takes ``size / min_batch_size`` loader
batches of ``min_batch_size`` (global) samples and concatenates them into one micro-batch
(:class:`ace3.runtime.loop.steps.StepRunner` splits it further on out-of-memory), where ``size``
follows the path:

- it starts at ``initial_batch_size``;
- after ``stable_steps`` optimizer steps in a row that the loss scaler did not skip, it grows to
  ``size x growth_factor`` (rounded down to a multiple of ``min_batch_size``, at least one
  more), capped at ``target_batch_size`` and below any size that ran out of memory;
- on instability (:meth:`BatchGrowth.on_instability`, called by the instability guard) or
  out-of-memory it shrinks to ``size x shrink_factor`` (rounded down, at least
  ``min_batch_size``) and the count starts again.

Out of memory: a one-process run retries the step in place (its micro-batch halved, as without
growth) and later steps run at the shrunk size, never growing back to the size that failed. With
several processes the attempt ends (exit 75) and the worker runs the next one from the newest
checkpoint with ``micro_batch_split`` doubled; that attempt starts from the checkpoint's size
shrunk once per doubling since the checkpoint was written, and never grows back to the
checkpoint's size.

Every rank takes the same decisions at the same steps (they depend on the step count, the
scaler's agreed skips and calls made on every rank). The position on the path (size, steps
without trouble, the ceiling, the split it was saved under) rides in the checkpoint's train
state (``carry["batch_growth"]``), so a resume follows the same path. The ``batch_size`` metric
(the effective global batch of the step reported) joins every training-metrics report, and a
metrics event carries it at the first step of each new size (with a log line).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from ace3.config import TrainingConfig
from ace3.config.batch_growth import DynamicBatchSizeConfig, batch_growth
from ace3.runtime.loop.extensions import LoopExtension
from ace3.runtime.loop.step_counts import steps_per_epoch
from ace3.runtime.loop.train_state import TrainState
from ace3.runtime.loop.view import LoopView

CARRY_KEY = "batch_growth"


class AccumulationPlan:
    """No growth: ``accumulation`` loader batches per step, each its own micro-batch."""

    lr_factor = 1.0

    def __init__(self, accumulation: int) -> None:
        self.accumulation = accumulation

    def batches_per_step(self) -> int:
        return self.accumulation

    def batch_index(self, batch_in_epoch: int) -> int:
        """The index of the step's first batch for hooks (``on_batch_begin``)."""
        return batch_in_epoch // self.accumulation

    def combine(self, batches: list[Any]) -> list[Any]:
        return batches

    def report(self) -> dict[str, float]:
        return {}


class _CannotConcatenate(Exception):
    pass


def concatenate_batches(batches: list[Any]) -> list[Any]:
    """One batch holding every sample of ``batches`` (tensors concatenated along dim 0, through
    mappings, lists and tuples), as a one-element list; ``batches`` unchanged when they hold
    something else (they then run as separate micro-batches: the same effective batch)."""
    if len(batches) <= 1:
        return batches
    try:
        return [_concatenate(batches)]
    except _CannotConcatenate:
        return batches


def _concatenate(items: list[Any]) -> Any:
    first = items[0]
    if isinstance(first, torch.Tensor):
        if first.ndim == 0 or not all(
            isinstance(t, torch.Tensor) and t.ndim == first.ndim and t.shape[1:] == first.shape[1:]
            for t in items
        ):
            raise _CannotConcatenate
        return torch.cat(items)
    if isinstance(first, Mapping):
        if not all(isinstance(i, Mapping) and i.keys() == first.keys() for i in items):
            raise _CannotConcatenate
        return {key: _concatenate([i[key] for i in items]) for key in first}
    if isinstance(first, (list, tuple)):
        if not all(type(i) is type(first) and len(i) == len(first) for i in items):
            raise _CannotConcatenate
        parts = [_concatenate([i[k] for i in items]) for k in range(len(first))]
        return type(first)(*parts) if hasattr(first, "_fields") else type(first)(parts)
    raise _CannotConcatenate


def largest(settings: DynamicBatchSizeConfig, ceiling: int) -> int:
    """The largest size the path may reach: ``target_batch_size``, or the largest multiple of
    ``min_batch_size`` not above ``ceiling`` (below a size that ran out of memory)."""
    low = settings.min_batch_size
    return max(low, min(settings.target_batch_size, ceiling) // low * low)


def grown(size: int, settings: DynamicBatchSizeConfig, ceiling: int) -> int:
    """The next size up (``size`` itself when it cannot grow)."""
    low = settings.min_batch_size
    bigger = max(size + low, int(size * settings.growth_factor) // low * low)
    return max(size, min(bigger, largest(settings, ceiling)))


def shrunk(size: int, settings: DynamicBatchSizeConfig) -> int:
    """The next size down (``min_batch_size`` at least)."""
    low = settings.min_batch_size
    return max(low, min(size - low, int(size * settings.shrink_factor) // low * low))


def grown_path_steps(
    settings: DynamicBatchSizeConfig,
    batches_per_epoch: int,
    epochs: int,
    max_steps: int | None,
    state: TrainState,
) -> int:
    """The optimizer steps of a run that follows the growth path without trouble (no shrink),
    counted from step 0, from ``state`` (what schedule horizons use). A shrink makes the run
    longer: then every step runs past this count at the schedule's last rate (the ``start``
    record's upper bound is the path at ``min_batch_size``, which no run exceeds)."""
    position = _Position.from_state(state, settings)
    step, epoch, batch = state.step, state.epoch, state.batch_in_epoch
    size, stable, low = position.size, position.stable, settings.min_batch_size
    top = largest(settings, position.ceiling)
    while epoch < epochs and (max_steps is None or step < max_steps):
        if size >= top:  # the rest at a constant size: the closed form
            per_step = size // low
            step += steps_per_epoch(max(0, batches_per_epoch - batch), per_step)
            step += (epochs - epoch - 1) * steps_per_epoch(batches_per_epoch, per_step)
            break
        if batch >= batches_per_epoch:
            epoch, batch = epoch + 1, 0
            continue
        batch += min(size // low, batches_per_epoch - batch)
        step, stable = step + 1, stable + 1
        if stable >= settings.stable_steps:
            size, stable = grown(size, settings, position.ceiling), 0
    return step if max_steps is None else min(step, max(max_steps, state.step))


class _Position:
    """Where a run stands on the path (what a checkpoint carries)."""

    def __init__(self, size: int, stable: int, ceiling: int, split: int) -> None:
        self.size, self.stable, self.ceiling, self.split = size, stable, ceiling, split

    @classmethod
    def from_state(cls, state: TrainState, settings: DynamicBatchSizeConfig) -> _Position:
        saved = state.carry.get(CARRY_KEY)
        fresh = cls(settings.initial_batch_size, 0, settings.target_batch_size, 1)
        if not saved or len(saved) != 4:
            return fresh
        size, stable, ceiling, split = (int(value) for value in saved)
        low = settings.min_batch_size
        if size < low or size % low or size > settings.target_batch_size or split < 1:
            return fresh  # a checkpoint of other settings: start the path again
        return cls(size, max(0, stable), max(low, ceiling), split)

    def to_carry(self) -> list[float]:
        return [float(self.size), float(self.stable), float(self.ceiling), float(self.split)]


class BatchGrowth(LoopExtension):
    """The growth controller of one rank: the loop's batch plan and a loop extension."""

    def __init__(self, settings: DynamicBatchSizeConfig, config: TrainingConfig) -> None:
        self.settings, self.log_interval = settings, config.log_interval
        self.position = _Position(settings.initial_batch_size, 0, settings.target_batch_size, 1)
        self.step_size = settings.initial_batch_size  # the size of the step in progress
        self.previous_size: int | None = None  # the size of the step before it
        self.loop: LoopView | None = None  # (from start on)
        self.troubled = False  # the step in progress ran out of memory

    # -- the loop's plan ----------------------------------------------------------------------
    @property
    def lr_factor(self) -> float:
        ratio = self.step_size / self.settings.initial_batch_size
        rule = self.settings.scale_learning_rate
        return ratio if rule == "linear" else math.sqrt(ratio) if rule == "sqrt" else 1.0

    def batches_per_step(self) -> int:
        self.step_size = self.position.size  # (the loop takes its lr_factor for the step)
        return self.position.size // self.settings.min_batch_size

    def batch_index(self, batch_in_epoch: int) -> int:
        """Loader batches of the epoch before this step (the steps' sizes vary)."""
        return batch_in_epoch

    def combine(self, batches: list[Any]) -> list[Any]:
        return concatenate_batches(batches)

    def report(self) -> dict[str, float]:
        return {"batch_size": float(self.step_size)}

    # -- the extension points -----------------------------------------------------------------
    def start(self, loop: LoopView) -> None:
        self.loop = loop
        self.position = _Position.from_state(loop.state, self.settings)
        self.step_size = self.position.size
        split = max(1, loop.micro_batch_split)
        doublings = max(0, split.bit_length() - self.position.split.bit_length())
        if doublings:  # an earlier attempt of this job ran out of memory (see the docstring)
            before = self.position.size
            self.position.ceiling = max(self.settings.min_batch_size, before - 1)
            for _ in range(doublings):
                self.position.size = shrunk(self.position.size, self.settings)
            self.position.stable = 0
            loop.log(
                f"batch size {before} -> {self.position.size}: an earlier attempt ran out of "
                f"memory (micro-batch split {split}); it grows no further than {self._cap()}"
            )
        self.position.split = split
        self.step_size = self.position.size
        loop.log(
            f"batch-size growth: {self.position.size} now, up to {self._cap()} after "
            f"{self.settings.stable_steps} stable step(s) each (loader batches of "
            f"{self.settings.min_batch_size})"
        )

    def after_step(self, loop: LoopView) -> None:
        step = loop.state.step
        changed = self.previous_size is not None and self.step_size != self.previous_size
        if changed and not _reports_at(loop, step, self.log_interval):
            loop.report_metrics({"batch_size": float(self.step_size)})
        self.previous_size = self.step_size
        position = self.position
        if loop.last_step_skipped or self.troubled:  # an overflow, an OOM: not stable
            position.stable, self.troubled = 0, False
            return
        position.stable += 1
        if position.stable >= self.settings.stable_steps:
            position.stable = 0
            bigger = grown(position.size, self.settings, position.ceiling)
            if bigger != position.size:
                self._change(loop, bigger, f"{self.settings.stable_steps} stable step(s)")

    def on_instability(self, loop: LoopView, reason: str) -> None:
        self.position.stable = 0
        smaller = shrunk(self.position.size, self.settings)
        if smaller != self.position.size:
            self._change(loop, smaller, f"instability: {reason}")

    def saving(self) -> contextlib.AbstractContextManager[Any]:
        if self.loop is not None:
            self.loop.keep_in_checkpoint(CARRY_KEY, self.position.to_carry())
        return contextlib.nullcontext()

    def finish(self, loop: LoopView) -> dict[str, Any]:
        return {"batch_size": self.step_size}  # what the last step ran

    # -- changes ------------------------------------------------------------------------------
    def _cap(self) -> int:
        return largest(self.settings, self.position.ceiling)

    def _change(self, loop: LoopView, size: int, why: str, ahead: int = 1) -> None:
        """The next steps run at ``size`` (from ``ahead`` steps after the last finished one)."""
        before, self.position.size = self.position.size, size
        loop.log(f"batch size {before} -> {size} from step {loop.state.step + ahead} ({why})")

    def out_of_memory(self) -> None:
        """A one-process run's step ran out of memory (it is retried in place; the step runner
        calls this): later steps run smaller and never reach this size again."""
        assert self.loop is not None
        failed = self.step_size
        self.position.ceiling = max(self.settings.min_batch_size, failed - 1)
        self.position.stable, self.troubled = 0, True
        smaller = shrunk(min(self.position.size, failed), self.settings)
        if smaller != self.position.size:  # (the failed step is still in progress)
            self._change(self.loop, smaller, f"out of memory at batch size {failed}", ahead=2)


def _reports_at(loop: LoopView, step: int, log_interval: int) -> bool:
    """Whether the loop reports training metrics (``batch_size`` with them) after this step:
    the interval's report, or the last step of an epoch or of the run."""
    max_steps = loop.config.max_steps
    return (
        step == 1
        or step % log_interval == 0
        or loop.state.batch_in_epoch >= loop.batches_per_epoch
        or (max_steps is not None and step >= max_steps)
    )


def batch_plan_for(config: TrainingConfig) -> BatchGrowth | None:
    """The growth controller ``config`` asks for, or None (the loop then accumulates)."""
    settings = batch_growth(config)
    return None if settings is None else BatchGrowth(settings, config)


@contextlib.contextmanager
def scaled_learning_rate(optimizer: torch.optim.Optimizer, factor: float) -> Iterator[None]:
    """Every group's learning rate times ``factor`` for one optimizer step, then the exact
    values back (schedules and checkpoints only ever see the unscaled rates)."""
    if factor == 1.0:
        yield
        return
    saved = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = group["lr"] * factor
    try:
        yield
    finally:
        for group, lr in zip(optimizer.param_groups, saved, strict=True):
            group["lr"] = lr
