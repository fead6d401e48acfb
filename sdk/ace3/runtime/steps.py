"""One optimizer step: accumulation over micro-batches, loss scaling, clipping, OOM recovery.

Gradients are synchronised the way a hand-written loop would (no collective of ours in the
step, no host read):

- DDP (and ZeRO-1, whose model is replicated): every micro-batch but the last runs under
  ``no_sync()``; the last one's backward all-reduces the accumulated gradients in DDP's
  buckets, overlapped with the backward pass. DDP broadcasts rank 0's buffers (BatchNorm
  statistics) at each forward pass, as it does by default. A one-process run needs no
  collective at all: every micro-batch runs under ``no_sync()``. Step 1 alone all-reduces
  the gradients itself, to learn whether the model leaves some parameter without a gradient
  (DDP then needs ``find_unused_parameters=True``, which only such a model gets).
- ZeRO-2/3 (FSDP, ``parts.sharding.fsdp``): every micro-batch but the last runs with FSDP's
  gradient reduce-scatter turned off (``set_requires_gradient_sync(False)``), the last one
  reduce-scatters inside its backward pass; buffers are broadcast from rank 0 once per step
  (FSDP does not sync them).
- Tensor parallel: no DDP; the sharded layers' collectives run inside forward and backward.

Clipping uses torch's ``clip_grad_norm_`` (the global norm over sharded DTensor gradients too).

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
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _take_tensors, _unflatten_dense_tensors

from ace3.errors import StepOutOfMemoryError
from ace3.runtime.build import Components, wrap_ddp
from ace3.runtime.distributed import DistContext
from ace3.runtime.losses import batch_size_of, forward_loss, move_to_device
from ace3.runtime.sharding import set_gradient_sync, trainable

OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory")
FIRST_STEP_BUCKET_BYTES = 25 << 20  # DDP's default bucket size
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


class StepRunner:
    """Runs optimizer steps for one rank; remembers how far micro-batches had to be split."""

    def __init__(self, parts: Components, ctx: DistContext, config: Any) -> None:
        self.parts, self.ctx, self.config = parts, ctx, config
        # Each loader batch runs as this many micro-batches: 1, or what an earlier attempt that
        # ran out of memory left (job.json's micro_batch_split).
        self.split = max(1, int(getattr(parts, "micro_batch_split", 1) or 1))
        self.fsdp = parts.sharding is not None and parts.sharding.fsdp
        # Tensor parallel: no DDP; every rank runs the same batch and the sharded layers'
        # collectives run inside the forward and backward passes.
        self.tensor_parallel = getattr(parts, "model_parallel", None) is not None
        self.recovers_from_oom = bool(config.dynamic_batch_size)
        # One process: DDP would all-reduce over itself; its gradients are already the mean.
        self.local_only = ctx.world_size == 1 and not self.fsdp and not self.tensor_parallel
        # DDP over several processes: unless the config says, the first step learns whether
        # every parameter gets a gradient (see _first_step_sync); until then DDP's own reduction
        # stays off.
        self.first_step = config.find_unused_parameters is None and not (
            self.local_only or self.fsdp or self.tensor_parallel
        )
        self.last_step_skipped = False  # the loss scaler skipped the last step (overflow)

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

    def _sync(self, final: bool) -> contextlib.AbstractContextManager[Any]:
        """How this micro-batch's backward synchronises gradients (see the module docstring)."""
        parts = self.parts
        if self.fsdp:
            set_gradient_sync(parts.ddp, final)
            return contextlib.nullcontext()
        if self.tensor_parallel or (final and not self.local_only and not self.first_step):
            return contextlib.nullcontext()
        return parts.ddp.no_sync()  # type: ignore[operator,no-any-return]

    def _forward_backward(self, chunks: list[tuple[Any, float]]) -> tuple[torch.Tensor, int]:
        parts = self.parts
        step_loss = torch.zeros((), dtype=torch.float32, device=self.ctx.device)
        samples = 0
        for i, (raw, weight) in enumerate(chunks):
            batch = move_to_device(raw, self.ctx.device)
            samples += batch_size_of(batch)
            with self._sync(final=i == len(chunks) - 1):
                with parts.precision.autocast():
                    loss = forward_loss(parts.ddp, batch, parts.user.compute_loss).loss
                parts.scaler.scale(loss * weight).backward()
            step_loss += loss.detach().float() * weight
        return step_loss, samples

    def _drop_gradients(self) -> None:
        self.parts.precision.zero_grad(self.parts.optimizer)
        gc.collect()
        if self.ctx.device.type == "cuda":
            torch.cuda.empty_cache()

    def run(self, batches: list[Any], step: int) -> tuple[torch.Tensor, int]:
        """Run one optimizer step over ``batches`` (loader batches); return (mean loss, samples)."""
        parts, config = self.parts, self.config
        while True:
            parts.precision.zero_grad(parts.optimizer)
            if self.fsdp and self.ctx.world_size > 1:
                self._broadcast_buffers()
            try:
                step_loss, samples = self._forward_backward(self._micro_batches(batches))
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
        if self.first_step:
            self._first_step_sync()
        precision = parts.precision
        precision.grads_to_optimizer()
        if config.max_grad_norm is not None:
            parts.scaler.unscale_(parts.optimizer)
            clipped = (
                trainable(parts.model) if self.fsdp else precision.clip_parameters(parts.model)
            )
            if self.tensor_parallel:  # DTensor and plain gradients together
                from ace3.runtime.tensor_parallel import clip_mixed_grad_norm

                clip_mixed_grad_norm(clipped, config.max_grad_norm)
            else:
                torch.nn.utils.clip_grad_norm_(clipped, config.max_grad_norm)
        scale = parts.scaler.get_scale()
        parts.scaler.step(parts.optimizer)
        self.last_step_skipped = bool(parts.scaler.last_step_skipped)
        parts.scaler.update()
        precision.weights_from_optimizer()
        if self.last_step_skipped and self.ctx.is_main:  # the same decision on every rank
            print(
                f"step {step + 1}: inf/nan gradients at loss scale {scale:g}: step skipped, "
                f"loss scale now {parts.scaler.get_scale():g}",
                flush=True,
            )
        return step_loss, samples

    def _first_step_sync(self) -> None:
        """Step 1 of DDP over several processes: all-reduce the gradients ourselves (flattened
        in buckets of at most FIRST_STEP_BUCKET_BYTES per dtype, as DDP's) and learn whether some
        parameter got no gradient on some rank. DDP's bucketed reduction, which every later step uses, needs
        ``find_unused_parameters=True`` for such a model (it would fail at step 2 otherwise),
        which costs a graph traversal per step: only a model that needs it gets it."""
        parts, world = self.parts, self.ctx.world_size
        grads: list[torch.Tensor] = []
        unused = 0
        for param in parts.model.parameters():
            if not param.requires_grad:
                continue
            if param.grad is None:  # unused this step on this rank: it still takes part
                param.grad = torch.zeros_like(param)
                unused += 1
            grads.append(param.grad)
        flag = torch.tensor([float(unused)], device=self.ctx.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        for bucket in _take_tensors(grads, FIRST_STEP_BUCKET_BYTES):  # (bounded extra memory)
            flat = _flatten_dense_tensors(bucket)
            flat /= world  # (before the sum, as DDP's default hook does: the same arithmetic)
            dist.all_reduce(flat)
            for grad, synced in zip(bucket, _unflatten_dense_tensors(flat, bucket), strict=True):
                grad.copy_(synced)
            del flat
        self.first_step = False
        if flag.item() > 0:
            parts.ddp = None  # type: ignore[assignment]  # (its buckets go before the new ones)
            gc.collect()
            parts.ddp = wrap_ddp(parts.model, self.ctx, find_unused_parameters=True)
            if self.ctx.is_main:
                print(
                    "some parameters got no gradient in step 1: DDP runs with "
                    "find_unused_parameters=True (slower; a model that uses every parameter "
                    "in each forward pass avoids it)",
                    flush=True,
                )

    def _broadcast_buffers(self) -> None:
        for buffer in self.parts.model.buffers():
            dist.broadcast(buffer, src=0)

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
        if self.ctx.world_size > 1 or self.fsdp:  # (FSDP's hooks cannot redo a step either)
            raise StepOutOfMemoryError(step + 1, current, self.split) from failure
        self.split *= 2
        print(
            f"out of memory at step {step + 1} with micro-batch {current}: retrying with "
            f"micro-batch {-(-micro // self.split)} and {len(batches) * self.split} "
            "accumulation micro-steps per optimizer step (effective batch unchanged)",
            flush=True,
        )
