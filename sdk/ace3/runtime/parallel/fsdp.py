"""ZeRO stages 2 and 3 (and offload) on FSDP2 ``fully_shard``: see
:mod:`ace3.runtime.parallel.sharding` for the units and the offload policy.

The step: every micro-batch but the last of an optimizer step runs with FSDP's gradient
reduce-scatter turned off (``set_requires_gradient_sync(False)``), the last one
reduce-scatters inside its backward pass; buffers are broadcast from rank 0 once per step
(FSDP does not sync them). Forward passes are collectives (parameters are all-gathered), so
validation runs in lockstep and an out-of-memory step is never redone in place. Checkpoints
are sharded (:mod:`ace3.runtime.checkpoint.sharded`, over torch's distributed state dict); an
in-process run shards a copy of the caller's module and writes the trained weights back at
the end.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ace3.runtime.checkpoint.state_dicts import DistributedStateDicts, StateDicts
from ace3.runtime.loop.evaluation import evaluate
from ace3.runtime.loop.optim import build_optimizer
from ace3.runtime.loop.precision import Precision
from ace3.runtime.observe.log import ENGINE
from ace3.runtime.parallel.base import Strategy, full_norm, total_grad_norm
from ace3.runtime.parallel.ddp import checkpoint_activations, place_on_device
from ace3.runtime.parallel.sharding import (
    ShardingPlan,
    plan_notes,
    reshard,
    set_gradient_sync,
    shard_model,
    trainable,
    training_copy,
    write_back,
)
from ace3.runtime.parallel.zero1 import ZeroRedundancy
from ace3.runtime.user_code import UserCode

if TYPE_CHECKING:
    from ace3.runtime.parallel.parts import StepParts


class FullyShardedDataParallel(ZeroRedundancy):
    """ZeRO-2/3: parameters, gradients and optimizer state sharded over the ranks."""

    def __init__(self, *args: Any, plan: ShardingPlan, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.plan = plan
        self.zero_stage = plan.stage
        self.first_step = False  # FSDP reduces every parameter's gradient itself
        self.write_back_to: nn.Module | None = None  # an in-process run's own module

    def checkpoint_state(self) -> StateDicts:
        return DistributedStateDicts()  # torch's own view of FSDP2's sharded state

    def describe(self) -> list[str]:
        return plan_notes(self.plan, self.config, self.ctx.world_size)

    def in_place_oom_retry(self) -> bool:
        return False  # FSDP's hooks cannot redo a step

    # -- build ----------------------------------------------------------------------------------
    def prepare(
        self,
        model: nn.Module,
        precision: Precision,
        user: UserCode,
        ckpt: dict[str, Any] | None,
        live_module: bool,
    ) -> nn.Module:
        ctx = self.ctx
        place_on_device(model, precision, ctx)
        if live_module:
            self.write_back_to, model = model, training_copy(model)
        checkpoint_activations(model, self.config, ctx)
        units = shard_model(model, self.plan, ctx)  # O0/O1 only: the optimizer takes the params
        if ctx.is_main:
            ENGINE.info(f"FSDP units: {units} layer(s) + the root")
        return model

    def make_optimizer(
        self, model: nn.Module, precision: Precision, user: UserCode | None = None
    ) -> torch.optim.Optimizer:
        """Built after sharding: the config's optimizer or ``configure_optimizers``' over the
        sharded (DTensor) parameters."""
        if user is not None and user.configure_optimizers is not None:
            return Strategy.make_optimizer(self, model, precision, user)
        return build_optimizer(trainable(model), self.config)

    def adopt(
        self, optimizer: torch.optim.Optimizer, model: nn.Module, precision: Precision
    ) -> torch.optim.Optimizer:
        return optimizer  # its state is sharded with the parameters already

    def wrap(self, model: nn.Module) -> None:
        self.forward = model

    # -- the step -------------------------------------------------------------------------------
    def before_step(self, parts: StepParts) -> None:
        self._broadcast_buffers(parts)

    def sync_context(self, final: bool) -> contextlib.AbstractContextManager[Any]:
        assert self.forward is not None
        set_gradient_sync(self.forward, final)
        return contextlib.nullcontext()

    def clip_gradients(self, parts: StepParts, max_norm: float) -> torch.Tensor:
        return full_norm(torch.nn.utils.clip_grad_norm_(trainable(parts.model), max_norm))

    def grad_norm(self, parts: StepParts) -> torch.Tensor:
        return total_grad_norm(trainable(parts.model))

    # -- validation -----------------------------------------------------------------------------
    def evaluate(self, parts: StepParts, loader: Any) -> dict[str, float]:
        self._broadcast_buffers(parts)
        try:
            return evaluate(
                parts.model, loader, self.ctx.device, parts.precision, parts.user, lockstep=True
            )
        finally:  # ZeRO-2 keeps the parameters gathered after a forward without backward
            reshard(parts.model)

    def finish(self, parts: StepParts) -> None:
        if self.write_back_to is not None:
            write_back(parts.model, self.write_back_to)
