"""Data parallelism: a replicated model under ``DistributedDataParallel`` (ZeRO stage 0; ZeRO-1
builds on it in :mod:`ace3.runtime.parallel.zero1`).

Gradients are synchronised as a hand-written loop would: every micro-batch but the last of an
optimizer step runs under ``no_sync()``; the last one's backward all-reduces the accumulated
gradients in DDP's buckets, overlapped with the backward pass. DDP broadcasts rank 0's buffers
(BatchNorm statistics) at each synchronised forward pass, as it does by default. A one-process
run needs no collective at all: every micro-batch runs under ``no_sync()``.

Step 1 (several processes, ``find_unused_parameters=None``) all-reduces the gradients itself,
to learn whether the model leaves some parameter without a gradient; DDP then needs
``find_unused_parameters=True`` (a graph traversal per step), which only such a model gets.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ace3.config import TrainingConfig
from ace3.runtime.loop.evaluation import evaluate
from ace3.runtime.loop.precision import Precision
from ace3.runtime.observe.log import ENGINE
from ace3.runtime.parallel.base import Strategy, average_over
from ace3.runtime.parallel.communication import (
    ddp_options,
    reduction_dtype,
    register_compression,
)
from ace3.runtime.process.distributed import DistContext
from ace3.runtime.techniques.grad_checkpointing import enable_gradient_checkpointing
from ace3.runtime.user_code import UserCode

if TYPE_CHECKING:
    from ace3.runtime.parallel.parts import StepParts


def _buffer_sync(every_forward: bool) -> dict[str, bool]:
    """DDP's "sync buffers at each forward" switch: ``forward_sync_buffers`` in recent torch
    (``broadcast_buffers`` is deprecated there), ``broadcast_buffers`` before."""
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters:
        return {"forward_sync_buffers": every_forward}
    return {"broadcast_buffers": every_forward}


def wrap_ddp(
    model: nn.Module,
    ctx: DistContext,
    find_unused_parameters: bool = False,
    process_group: Any = None,
    config: TrainingConfig | None = None,
) -> nn.Module:
    """DDP as a hand-written loop sets it up: bucketed all-reduce overlapped with the backward
    pass, rank 0's buffers broadcast at each synchronised forward; ``config``'s
    ``communication_data_type`` and ``ddp_bucket_cap_mb``
    (:mod:`ace3.runtime.parallel.communication`)."""
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    ddp = DistributedDataParallel(
        model,
        device_ids=device_ids,
        find_unused_parameters=find_unused_parameters,
        process_group=process_group,
        **_buffer_sync(True),
        **(ddp_options(config) if config is not None else {}),
    )
    if config is not None:
        register_compression(ddp, reduction_dtype(config.communication_data_type), process_group)
    return ddp


def place_on_device(model: nn.Module, precision: Precision, ctx: DistContext) -> None:
    """Move ``model`` to this rank's device and cast it for the precision level."""
    model.to(ctx.device)
    precision.prepare_model(model)


def checkpoint_activations(model: nn.Module, config: TrainingConfig, ctx: DistContext) -> None:
    """Gradient checkpointing when the config asks for it (said once in the log)."""
    if config.gradient_checkpointing:
        how = enable_gradient_checkpointing(model, config.checkpoint_segments)
        if ctx.is_main:
            ENGINE.info(f"gradient checkpointing: {how}")


class DataParallel(Strategy):
    """ZeRO stage 0: every rank holds the whole model and optimizer state."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        config, ctx = self.config, self.ctx
        # One process: DDP would all-reduce over itself; its gradients are already the mean.
        self.local_only = ctx.world_size == 1
        # Until step 1 has shown whether every parameter gets a gradient, DDP's own reduction
        # stays off (see the module docstring).
        self.first_step = config.find_unused_parameters is None and not self.local_only

    # -- build ----------------------------------------------------------------------------------
    def prepare(
        self,
        model: nn.Module,
        precision: Precision,
        user: UserCode,
        ckpt: dict[str, Any] | None,
        live_module: bool,
    ) -> nn.Module:
        place_on_device(model, precision, self.ctx)
        checkpoint_activations(model, self.config, self.ctx)
        return model

    def wrap(self, model: nn.Module) -> None:
        find_unused = bool(self.config.find_unused_parameters)
        self.forward = wrap_ddp(
            model, self.ctx, find_unused_parameters=find_unused, config=self.config
        )

    # -- the step -------------------------------------------------------------------------------
    def sync_context(self, final: bool) -> contextlib.AbstractContextManager[Any]:
        if final and not self.local_only and not self.first_step:
            return contextlib.nullcontext()
        return self.forward.no_sync()  # type: ignore[union-attr]  # wrap() set it before the first step

    def after_backward(self, parts: StepParts) -> None:
        if self.first_step:
            self._first_step_sync(parts)

    def _first_step_sync(self, parts: StepParts) -> None:
        """Step 1 over several processes: all-reduce the gradients ourselves (in buckets, as
        DDP's: :func:`~ace3.runtime.parallel.base.average_over`) and learn whether some
        parameter got no gradient on some rank. DDP's bucketed reduction, which every later step
        uses, needs ``find_unused_parameters=True`` for such a model (it would fail at step 2
        otherwise), which costs a graph traversal per step: only a model that needs it gets
        it."""
        world = self.ctx.world_size
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
        average_over(grads, world, dtype=reduction_dtype(self.config.communication_data_type))
        self.first_step = False
        if flag.item() > 0:
            self.forward = None  # (its buckets go before the new ones)
            gc.collect()
            self.forward = wrap_ddp(
                parts.model, self.ctx, find_unused_parameters=True, config=self.config
            )
            if self.ctx.is_main:
                ENGINE.info(
                    "some parameters got no gradient in step 1: DDP runs with "
                    "find_unused_parameters=True (slower; a model that uses every parameter "
                    "in each forward pass avoids it)"
                )

    # -- validation -----------------------------------------------------------------------------
    def _broadcast_buffers(self, parts: StepParts) -> None:
        if self.ctx.world_size > 1:
            for buffer in parts.model.buffers():
                dist.broadcast(buffer, src=0)

    def evaluate(self, parts: StepParts, loader: Any) -> dict[str, float]:
        # Every rank validates with rank 0's buffers (BatchNorm statistics): the ones the
        # checkpoint holds. DDP only syncs them at the next forward pass.
        self._broadcast_buffers(parts)
        return evaluate(parts.model, loader, self.ctx.device, parts.precision, parts.user)
