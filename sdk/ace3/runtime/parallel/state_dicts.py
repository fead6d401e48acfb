"""The checkpointed state of the strategies whose objects torch's distributed state dict does
not describe as they are (:class:`ace3.runtime.checkpoint.state_dicts.StateDicts`): DDP's
model under a precision level, ZeRO-1's ``ZeroRedundancyOptimizer``. FSDP's is torch's own
(:class:`~ace3.runtime.checkpoint.state_dicts.DistributedStateDicts`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ace3.runtime.checkpoint.state_dicts import DistributedStateDicts

if TYPE_CHECKING:
    from ace3.runtime.checkpoint.format import TrainingParts


class ReplicatedStateDicts(DistributedStateDicts):
    """DDP: a whole replica on every rank; a plain checkpoint's weights are full precision
    whatever the precision level (O2's master weights, O3's 16-bit ones cast back)."""

    def load_full(
        self, parts: TrainingParts, model: dict[str, Any], optimizer: dict[str, Any] | None
    ) -> None:
        parts.precision.load_model_state_dict(parts.model, model)
        if optimizer:
            parts.optimizer.load_state_dict(optimizer)

    def full_weights(self, parts: TrainingParts) -> dict[str, Any]:
        return parts.precision.model_state_dict(parts.model)


class ZeroRedundancyStateDicts:
    """ZeRO-1: the model replicated, each rank's ``ZeroRedundancyOptimizer`` holding the state
    of the parameters it owns; in the sharded layout every rank gives that state keyed by
    parameter name (so DCP can re-shard it over another number of ranks)."""

    def sharded(self, parts: TrainingParts, with_optimizer: bool, for_load: bool) -> dict[str, Any]:
        state: dict[str, Any] = {"model": parts.model.state_dict()}
        if with_optimizer:
            optimizer: Any = parts.optimizer  # a ZeroRedundancyOptimizer
            if for_load:
                _initialise_state(optimizer.optim)
            state["optimizer"] = _zero_state(optimizer, _names(parts.model))
        return state

    def load_sharded(
        self, parts: TrainingParts, state: dict[str, Any], with_optimizer: bool
    ) -> None:
        parts.model.load_state_dict(state["model"])
        if with_optimizer:  # (the state tensors were loaded in place)
            _apply_zero_groups(parts.optimizer, state["optimizer"]["param_groups"])

    def load_full(
        self, parts: TrainingParts, model: dict[str, Any], optimizer: dict[str, Any] | None
    ) -> None:
        parts.model.load_state_dict(model)
        if optimizer:
            parts.optimizer.load_state_dict(optimizer)

    def full_weights(self, parts: TrainingParts) -> dict[str, Any]:
        return {key: value.detach().cpu() for key, value in parts.model.state_dict().items()}


def _names(model: nn.Module) -> dict[int, str]:
    return {id(param): name for name, param in model.named_parameters()}


def _zero_state(optimizer: Any, names: dict[int, str]) -> dict[str, Any]:
    """The state of the parameters this rank owns, keyed by parameter name; the parameter
    groups with every hyperparameter of the wrapped class (from the local optimizer), the
    current values (lr after the schedule) from the global groups, parameters by name."""
    local = optimizer.optim
    groups = []
    for index, group in enumerate(optimizer.param_groups):
        hyper = {k: v for k, v in local.param_groups[index].items() if k != "params"}
        hyper.update({k: v for k, v in group.items() if k != "params"})
        groups.append({**hyper, "params": [names[id(p)] for p in group["params"]]})
    return {
        "state": {
            names[id(p)]: local.state[p]
            for group in local.param_groups
            for p in group["params"]
            if p in local.state
        },
        "param_groups": groups,
    }


def _initialise_state(optimizer: torch.optim.Optimizer) -> None:
    """Create an optimizer's state tensors (so DCP has somewhere to load into): one step with
    zero gradients at learning rate 0, as ``torch.distributed.checkpoint.state_dict`` does."""
    if optimizer.state:
        return
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if not params:
        return
    for param in params:
        param.grad = torch.zeros_like(param)
    rates = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    optimizer.step()
    for group, lr in zip(optimizer.param_groups, rates, strict=True):
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)


def _apply_zero_groups(optimizer: Any, groups: list[dict[str, Any]]) -> None:
    """Set the saved hyperparameters (lr, betas, ...) on the global and local groups."""
    if len(groups) != len(optimizer.param_groups):
        raise ValueError(
            f"the checkpoint's optimizer has {len(groups)} parameter groups, this one "
            f"{len(optimizer.param_groups)}: resume with the same optimizer settings"
        )
    for saved, group, local in zip(
        groups, optimizer.param_groups, optimizer.optim.param_groups, strict=True
    ):
        for key, value in saved.items():
            if key == "params":
                continue
            if key in group:
                group[key] = value
            if key in local:
                local[key] = value
