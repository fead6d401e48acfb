"""One optimizer step: accumulation over micro-batches, loss scaling, clipping, OOM recovery.

The parallelism strategy (:mod:`ace3.runtime.parallel`) runs the micro-batches' forward and
backward passes and synchronises their gradients the way a hand-written loop would (no
collective of ours in the step, no host read), then clips; this runner adds what every
strategy shares: zeroing, micro-batch weights, the loss scaler, the optimizer step.

Out of memory (``dynamic_batch_size``, the default) costs nothing per step; it is handled when
it happens. A one-process run drops the step's gradients, halves its micro-batch (doubling the
micro-batches, so the effective batch is unchanged) and runs the step again; the halving sticks
for the rest of the run. With more processes the step cannot be retried in place (the peers may
already wait in the backward pass's all-reduce for the rank that failed), so that rank raises
:class:`ace3.errors.StepOutOfMemoryError`: the runtime exits with
:data:`ace3.errors.OUT_OF_MEMORY_EXIT_CODE`, torchrun stops the other ranks, and the worker
runs the next attempt from the job's newest checkpoint with ``micro_batch_split`` doubled
(``job.json``; :attr:`StepRunner.split` starts there). An out-of-memory error never hangs a
job. Each micro-batch's loss is weighted by ``1 / micro-batches of the step``; pieces of a
split loader batch by their share of its samples, so a split step computes the same mean loss
as the unsplit one.

The gradient norm (the whole model's, unscaled, before clipping: :meth:`Strategy.grad_norm`)
is taken only when it costs nothing more (clipping takes it anyway), when the loop will report
metrics after the step (``measure_norm``), or every step with the instability guard
(:mod:`ace3.runtime.loop.instability`), which then decides before the optimizer step whether to
drop the update. The step's learning rate is the schedule's times ``state.lr_scale`` (what the
guard's rollbacks left; 1.0 otherwise) and batch-size growth's ``lr_factor``.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ace3.config.batch_growth import recovers_from_oom
from ace3.errors import StepOutOfMemoryError
from ace3.runtime.components import Components
from ace3.runtime.loop.batch_growth import scaled_learning_rate
from ace3.runtime.loop.instability import make_guard
from ace3.runtime.loop.losses import batch_size_of
from ace3.runtime.observe.log import ENGINE
from ace3.runtime.process.distributed import DistContext

OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory")
# DDP's reducer, at the forward pass after a backward that left some parameter without a
# gradient (find_unused_parameters=False).
_UNUSED_PARAMETER_MARKER = "expected to have finished reduction in the prior iteration"
UNUSED_PARAMETERS_ADVICE = (
    "a forward pass left some parameters without a gradient, which DDP needs to know in "
    "advance: set find_unused_parameters=True in the TrainingConfig (step 1 used every "
    "parameter, so the engine did not turn it on by itself)"
)


def is_unused_parameter_error(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeError) and _UNUSED_PARAMETER_MARKER in str(exc).lower()


def is_out_of_memory(exc: BaseException) -> bool:
    """True for CUDA OOM and for the CPU allocator refusing an allocation."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in OOM_MARKERS)


def split_batch(batch: Any, parts: int) -> list[Any]:
    """Split every tensor of a (nested) batch along dim 0 into ``parts`` near-equal chunks."""
    if parts == 1:
        return [batch]
    size = batch_size_of(batch)
    bounds = [size * i // parts for i in range(parts + 1)]
    return [
        _slice(batch, bounds[i], bounds[i + 1]) for i in range(parts) if bounds[i + 1] > bounds[i]
    ]


def _slice(batch: Any, start: int, stop: int) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch[start:stop] if batch.ndim else batch
    if isinstance(batch, Mapping):
        return {key: _slice(value, start, stop) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_slice(value, start, stop) for value in batch)
    return batch


def count_tokens(batch: Any) -> int:
    """Token ids in a loader batch, for ``tokens_per_sec``: a dict batch's ``attention_mask``
    sum (non-padding tokens) or else its ``input_ids`` element count; an ``(inputs, ...)``
    batch's inputs' element count when they are an integer tensor of at least 2 dimensions
    (batch x sequence); 0 otherwise (features, images). CPU tensors, no device read."""
    tensor: Any = None
    if isinstance(batch, Mapping):
        mask = batch.get("attention_mask")
        if isinstance(mask, torch.Tensor) and mask.device.type == "cpu":
            return int(mask.sum())
        tensor = batch.get("input_ids")
    elif isinstance(batch, (list, tuple)) and batch:
        tensor = batch[0]
        if not (isinstance(tensor, torch.Tensor) and tensor.ndim >= 2):
            return 0
    integer = isinstance(tensor, torch.Tensor) and not tensor.is_floating_point()
    if integer and tensor.dtype != torch.bool and not tensor.is_complex():
        return int(tensor.numel())
    return 0


class StepRunner:
    """Runs optimizer steps for one rank; remembers how far micro-batches had to be split."""

    def __init__(self, parts: Components, ctx: DistContext, config: Any) -> None:
        self.parts, self.ctx, self.config = parts, ctx, config
        self.strategy = parts.strategy
        # Each loader batch runs as this many micro-batches: 1, or what an earlier attempt that
        # ran out of memory left (job.json's micro_batch_split).
        self.split = max(1, int(getattr(parts, "micro_batch_split", 1) or 1))
        self.recovers_from_oom = recovers_from_oom(config) and self.strategy.splits_micro_batches
        self.last_step_skipped = False  # the loss scaler skipped the last step (overflow)
        # Batch-size growth (ace3.runtime.loop.batch_growth): the learning rate of the next steps is
        # the schedule's times this, and it hears of an out-of-memory step retried in place.
        self.lr_factor = 1.0
        self.on_out_of_memory: Callable[[], None] | None = (
            parts.batch_plan.out_of_memory if parts.batch_plan is not None else None
        )
        self.guard = make_guard(config.instability, ctx)
        self.dropped = False  # the guard dropped the last step's update
        self.grad_norm: torch.Tensor | None = None  # the global norm of a step's gradients...
        self.grad_norm_step = 0  # ... of this step (from 1)
        self.tokens = 0  # token ids this rank ran since the last report (see count_tokens)
        # ... and since they were last added to TrainState.trained_tokens (a report or a save)
        self.unbanked_tokens = 0
        self.busy_seconds = 0.0  # host time inside run() since the last report

    def take_span(self) -> tuple[float, int]:
        """(host seconds inside :meth:`run`, token ids run) since the last call (the metrics
        report's span); both start again from zero."""
        span = (self.busy_seconds, self.tokens)
        self.busy_seconds, self.tokens = 0.0, 0
        return span

    # -- the step -----------------------------------------------------------------------------
    def _micro_batches(self, batches: list[Any]) -> list[tuple[Any, float]]:
        """(micro-batch, loss weight) pairs: weights sum to 1 over the step."""
        group = len(batches)
        chunks: list[tuple[Any, float]] = []
        for batch in batches:
            total = batch_size_of(batch)
            for piece in split_batch(batch, self.split):
                chunks.append((piece, batch_size_of(piece) / total / group))
        return chunks

    def _drop_gradients(self) -> None:
        self.parts.precision.zero_grad(self.parts.optimizer)
        gc.collect()
        if self.ctx.device.type == "cuda":
            torch.cuda.empty_cache()

    def run(
        self, batches: list[Any], step: int, measure_norm: bool = False
    ) -> tuple[torch.Tensor, int]:
        """Run one optimizer step over ``batches`` (loader batches); return (mean loss, samples).
        ``measure_norm``: keep the gradient norm (:attr:`grad_norm`) for a report."""
        parts, config, strategy = self.parts, self.config, self.strategy
        started = time.perf_counter()
        for batch in batches:
            counted = count_tokens(batch)
            self.tokens += counted
            self.unbanked_tokens += counted
        while True:
            parts.precision.zero_grad(parts.optimizer)
            strategy.before_step(parts)
            for extension in parts.extensions:  # (distillation's projections)
                extension.before_forward()
            try:
                step_loss, samples = strategy.forward_backward(self._micro_batches(batches), parts)
                break
            except Exception as exc:
                if is_unused_parameter_error(exc):
                    raise RuntimeError(UNUSED_PARAMETERS_ADVICE) from exc
                if not (self.recovers_from_oom and is_out_of_memory(exc)):
                    raise
                # Without its traceback, the exception no longer holds the failed pass's frames
                # (and their activations), so dropping the step frees its memory.
                failure = exc.with_traceback(None)
            self._after_oom(failure, batches, step)
        strategy.after_backward(parts)
        precision = parts.precision
        precision.grads_to_optimizer()
        norm: torch.Tensor | None = None
        if config.max_grad_norm is not None or measure_norm or self.guard is not None:
            parts.scaler.unscale_(parts.optimizer)
            if config.max_grad_norm is not None:
                norm = strategy.clip_gradients(parts, config.max_grad_norm)
            else:
                norm = strategy.grad_norm(parts)
            self.grad_norm, self.grad_norm_step = norm, step + 1
        scale = parts.scaler.get_scale()
        self.dropped = self.guard is not None and self._guard_drops(step, step_loss, norm)
        if self.dropped:
            self.last_step_skipped = False
        else:
            self._optimizer_step()
        precision.weights_from_optimizer()
        if parts.extensions:  # (distillation's projections learn with the student)
            lr = parts.optimizer.param_groups[0]["lr"] * self.lr_factor * parts.state.lr_scale
            skipped = self.last_step_skipped or self.dropped
            for extension in parts.extensions:
                extension.after_optimizer_step(scale, skipped, float(lr))
        if self.last_step_skipped and self.ctx.is_main:  # the same decision on every rank
            ENGINE.info(
                f"step {step + 1}: inf/nan gradients at loss scale {scale:g}: step skipped, "
                f"loss scale now {parts.scaler.get_scale():g}"
            )
        self.busy_seconds += time.perf_counter() - started
        return step_loss, samples

    def _guard_drops(self, step: int, loss: torch.Tensor, norm: torch.Tensor | None) -> bool:
        """The guard's verdict on this step; an unstable step's gradients are dropped (and the
        loss scaler's unscale forgotten) unless the action is ``warn``."""
        assert self.guard is not None
        found = self.guard.check(step + 1, loss, norm, self.parts.scaler.is_enabled())
        if found is None or not self.guard.drops_update:
            return False
        self.parts.precision.zero_grad(self.parts.optimizer)
        return True

    def _optimizer_step(self) -> None:
        """The loss scaler's step at the schedule's learning rate times ``state.lr_scale``
        (the guard's rollbacks) and ``lr_factor`` (batch-size growth); the schedule's own
        rates are put back exactly afterwards."""
        parts = self.parts
        with scaled_learning_rate(parts.optimizer, self.lr_factor * parts.state.lr_scale):
            parts.scaler.step(parts.optimizer)
        self.last_step_skipped = bool(parts.scaler.last_step_skipped)
        parts.scaler.update()

    def _after_oom(self, failure: BaseException, batches: list[Any], step: int) -> None:
        """Halve the micro-batch and let the caller run the step again (one process), or end
        the attempt (see the module docstring)."""
        micro = max(batch_size_of(b) for b in batches)
        current = -(-micro // self.split)
        self._drop_gradients()
        if current <= 1:
            raise RuntimeError(
                f"out of memory at step {step + 1} even with a micro-batch of 1 sample: the "
                "model does not fit; use mixed precision, gradient checkpointing or a smaller "
                "model"
            ) from failure
        if not self.strategy.in_place_oom_retry():
            raise StepOutOfMemoryError(step + 1, current, self.split) from failure
        self.split *= 2
        ENGINE.info(
            f"out of memory at step {step + 1} with micro-batch {current}: retrying with "
            f"micro-batch {-(-micro // self.split)} and {len(batches) * self.split} "
            "accumulation micro-steps per optimizer step (effective batch unchanged)"
        )
        if self.on_out_of_memory is not None:
            self.on_out_of_memory()
