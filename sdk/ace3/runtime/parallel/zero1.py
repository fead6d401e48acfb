"""ZeRO-1: the model replicated under DDP as at stage 0 (:mod:`ace3.runtime.parallel.ddp`), the
optimizer a ``ZeroRedundancyOptimizer``: each rank keeps (and updates) the state of its share
of the parameters and broadcasts them after the step. Checkpoints are in the sharded format
(:mod:`ace3.runtime.checkpoint.sharded`), over the optimizer's state as
:class:`~ace3.runtime.parallel.state_dicts.ZeroRedundancyStateDicts` gives it, so they resume
on any number of ranks and at any ZeRO stage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from ace3.runtime.checkpoint.format import FormatKind
from ace3.runtime.checkpoint.state_dicts import StateDicts
from ace3.runtime.loop.configured_optimizer import rebind_scheduler
from ace3.runtime.loop.precision import Precision
from ace3.runtime.parallel.ddp import DataParallel
from ace3.runtime.parallel.sharding import (
    STAGE_SUMMARY,
    is_zero_redundancy,
    local_state_bytes,
    zero_redundancy_optimizer,
)
from ace3.runtime.parallel.state_dicts import ZeroRedundancyStateDicts
from ace3.runtime.user_code import UserCode

if TYPE_CHECKING:
    from ace3.runtime.parallel.parts import StepParts


class ZeroRedundancy(DataParallel):
    """ZeRO stage 1: the model replicated under DDP, each rank keeps (and updates) the optimizer
    state of its share of the parameters and broadcasts them after the step. Checkpoints are
    sharded (:mod:`ace3.runtime.checkpoint.sharded`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.zero_stage = 1

    def describe(self) -> list[str]:
        return [f"ZeRO stage 1 over {self.ctx.world_size} rank(s): {STAGE_SUMMARY[1]}"]

    def make_optimizer(
        self, model: nn.Module, precision: Precision, user: UserCode | None = None
    ) -> torch.optim.Optimizer:
        template = super().make_optimizer(model, precision, user)
        if is_zero_redundancy(template):  # configure_optimizers', wrapped by adopt()
            return template
        return zero_redundancy_optimizer(precision.optimizer_parameters(model), template)

    def adopt(
        self, optimizer: torch.optim.Optimizer, model: nn.Module, precision: Precision
    ) -> torch.optim.Optimizer:
        """ZeRO-1 wraps the model file's optimizer: its class, parameter groups and
        hyperparameters, each rank keeping the state of its share; its scheduler moves onto
        the wrapper."""
        wrapped = zero_redundancy_optimizer([dict(g) for g in optimizer.param_groups], optimizer)
        if self.configured_scheduler is not None:
            rebind_scheduler(self.configured_scheduler, wrapped)
        return wrapped

    checkpoint_format: ClassVar[FormatKind] = "sharded"

    def checkpoint_state(self) -> StateDicts:
        return ZeroRedundancyStateDicts()

    def state_bytes(self, parts: StepParts) -> int:
        return local_state_bytes(parts.model, parts.optimizer)
