"""One optimizer step: accumulation over micro-batches, loss scaling, clipping, OOM recovery.

Two ways to synchronise gradients across ranks:

- ``dynamic_batch_size=False``: DDP as usual. Every micro-batch but the last runs under
  ``no_sync()``; the last one's backward all-reduces the accumulated gradients, overlapped with
  the backward pass.
- ``dynamic_batch_size=True`` (the default): every micro-batch runs under ``no_sync()`` (no
  collective inside the loop), then the ranks agree on whether any of them ran out of memory
  (one tiny all-reduce), then the accumulated gradients are averaged with one flattened
  all-reduce per dtype. On out-of-memory every rank drops the step's gradients, halves its
  micro-batch (doubling the number of micro-batches, so the effective batch is unchanged),
  logs it and runs the step again; the halving sticks for the rest of the run. Buffers
  (BatchNorm statistics) are broadcast from rank 0 once per step, as DDP would at each forward.

ZeRO-2/3 (FSDP, ``parts.sharding.fsdp``) use neither: every micro-batch but the last runs with
FSDP's gradient reduce-scatter turned off (``set_requires_gradient_sync(False)``), the last
one reduce-scatters the accumulated gradients inside its backward pass, and buffers are
broadcast from rank 0 once per step. Out-of-memory recovery needs every rank to be able to
drop a step alone, which FSDP's in-backward collectives do not allow: ``dynamic_batch_size``
falls back to this plain path there (the build logs it). Clipping uses torch's
``clip_grad_norm_``, which computes the global norm over sharded (DTensor) gradients.
ZeRO-1 keeps the DDP paths above (the model is replicated; only the optimizer is sharded).

Either way, non-final micro-steps never all-reduce. Each micro-batch's loss is weighted by
``1 / micro-batches of the step``; halves of a split micro-batch by their share of its samples,
so a split step computes the same mean loss as the unsplit one.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from ace3.runtime.build import Components
from ace3.runtime.distributed import DistContext
from ace3.runtime.losses import batch_size_of, forward_loss, move_to_device
from ace3.runtime.sharding import set_gradient_sync, trainable

OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory")


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
        self.split = 1  # each loader batch runs as this many micro-batches
        self.fsdp = parts.sharding is not None and parts.sharding.fsdp
        # Tensor parallel: no DDP; every rank runs the same batch and the sharded layers'
        # collectives run inside the forward and backward passes (no OOM recovery either).
        self.tensor_parallel = getattr(parts, "model_parallel", None) is not None
        self.manual_sync = (
            bool(config.dynamic_batch_size) and not self.fsdp and not self.tensor_parallel
        )
        self.last_step_skipped = False  # the loss scaler skipped the last step (overflow)

    # -- gradients ----------------------------------------------------------------------------
    def _all_reduce_gradients(self) -> None:
        grads_by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for param in self.parts.model.parameters():
            if not param.requires_grad:
                continue
            if param.grad is None:  # unused this step on this rank: it still takes part
                param.grad = torch.zeros_like(param)
            grads_by_dtype.setdefault(param.grad.dtype, []).append(param.grad)
        for grads in grads_by_dtype.values():
            flat = _flatten_dense_tensors(grads)
            dist.all_reduce(flat)
            flat /= self.ctx.world_size
            for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
                grad.copy_(synced)

    def _broadcast_buffers(self) -> None:
        for buffer in self.parts.model.buffers():
            dist.broadcast(buffer, src=0)

    def _any_rank(self, flag: bool) -> bool:
        if self.ctx.world_size == 1:
            return flag
        value = torch.tensor([1.0 if flag else 0.0], device=self.ctx.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item() > 0)

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

    def _forward_backward(self, chunks: list[tuple[Any, float]]) -> tuple[torch.Tensor, int]:
        parts = self.parts
        step_loss = torch.zeros((), dtype=torch.float32, device=self.ctx.device)
        samples = 0
        for i, (raw, weight) in enumerate(chunks):
            batch = move_to_device(raw, self.ctx.device)
            samples += batch_size_of(batch)
            final = i == len(chunks) - 1
            if self.fsdp:
                set_gradient_sync(parts.ddp, final)
                sync: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
            elif self.tensor_parallel:
                sync = contextlib.nullcontext()
            elif self.manual_sync or not final:
                sync = parts.ddp.no_sync()  # type: ignore[operator]
            else:
                sync = contextlib.nullcontext()
            with sync:
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
            if (self.manual_sync or self.fsdp) and self.ctx.world_size > 1:
                self._broadcast_buffers()
            chunks = self._micro_batches(batches)
            failure: BaseException | None = None
            try:
                step_loss, samples = self._forward_backward(chunks)
            except Exception as exc:
                if not (self.manual_sync and is_out_of_memory(exc)):
                    raise
                failure = exc
            if self.manual_sync and self._any_rank(failure is not None):
                self._after_oom(failure, batches, step)
                continue
            break
        if self.manual_sync and self.ctx.world_size > 1:
            self._all_reduce_gradients()
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

    def _after_oom(self, failure: BaseException | None, batches: list[Any], step: int) -> None:
        micro = max(batch_size_of(b) for b in batches)
        current = -(-micro // self.split)
        where = "this rank" if failure is not None else "another rank"
        self._drop_gradients()
        if current <= 1:
            raise RuntimeError(
                f"out of memory at step {step + 1} on {where} even with a micro-batch of 1 "
                "sample: the model does not fit; use mixed precision, gradient checkpointing or "
                "a smaller model"
            ) from failure
        self.split *= 2
        if self.ctx.is_main:
            k = len(batches) * self.split
            print(
                f"out of memory at step {step + 1} ({where}) with micro-batch {current} per "
                f"rank: retrying with micro-batch {-(-micro // self.split)} and {k} "
                "accumulation micro-steps per optimizer step (effective batch unchanged)",
                flush=True,
            )
