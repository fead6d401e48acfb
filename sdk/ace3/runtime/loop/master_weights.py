"""float32 master copies of a 16-bit model's trainable parameters (AMP level O2).

The model computes in 16 bits; the optimizer updates float32 masters, so small updates are not
rounded away (a bfloat16 weight of 1.0 cannot absorb an update below 2**-8). Each step:
:meth:`MasterWeights.grads_to_masters` hands the model's 16-bit gradients to the masters (as
float32), the optimizer steps the masters, :meth:`MasterWeights.masters_to_model` rounds them
back into the model. Parameters that are already float32 (BatchNorm kept in float32) are their
own masters: no copy.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn


class MasterWeights:
    """The masters of one model, in ``model.named_parameters()`` order (trainable ones only)."""

    def __init__(self, model: nn.Module) -> None:
        self._pairs: list[tuple[str, nn.Parameter, nn.Parameter]] = []
        for name, param in model.named_parameters():
            if not param.requires_grad:
                continue
            if param.dtype == torch.float32 or not param.is_floating_point():
                master = param
            else:
                master = nn.Parameter(param.detach().to(torch.float32), requires_grad=True)
            self._pairs.append((name, param, master))
        self._by_param = {id(param): master for _, param, master in self._pairs}

    def parameters(self) -> list[nn.Parameter]:
        """What the optimizer updates (and what gradient clipping sees)."""
        return [master for _, _, master in self._pairs]

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """The masters under the model's parameter names (for per-name parameter groups)."""
        return [(name, master) for name, _, master in self._pairs]

    def grads_to_masters(self) -> None:
        """Give each master the model's gradient as float32; free the 16-bit gradients."""
        for _, param, master in self._pairs:
            if master is param:
                continue
            grad = param.grad
            master.grad = None if grad is None else grad.to(torch.float32)
            param.grad = None

    @torch.no_grad()
    def masters_to_model(self) -> None:
        """Round the masters into the model's 16-bit parameters."""
        for _, param, master in self._pairs:
            if master is not param:
                param.copy_(master)

    @torch.no_grad()
    def masters_from(self, state: Mapping[str, Any]) -> None:
        """Set the masters from a state dict's full-precision values (the model's own values
        where the state lacks a name)."""
        for name, param, master in self._pairs:
            if master is param:
                continue
            value = state.get(name)
            master.copy_(value if isinstance(value, torch.Tensor) else param)

    def full_precision_state_dict(self, model: nn.Module) -> dict[str, Any]:
        """``model.state_dict()`` with the masters' values for trainable parameters and every
        other floating tensor as float32."""
        return float32_state_dict(model, self._by_param)


def float32_state_dict(
    model: nn.Module, replacements: Mapping[int, torch.Tensor] | None = None
) -> dict[str, Any]:
    """``model.state_dict()`` with floating tensors as float32; a tensor whose ``id`` is in
    ``replacements`` is replaced by its mapped tensor (a master copy) first."""
    replacements = replacements or {}
    raw = model.state_dict(keep_vars=True)
    result: OrderedDict[str, Any] = OrderedDict()
    for key, value in raw.items():
        if isinstance(value, torch.Tensor):
            value = replacements.get(id(value), value).detach()
            if value.is_floating_point() and value.dtype != torch.float32:
                value = value.to(torch.float32)
        result[key] = value
    metadata = getattr(raw, "_metadata", None)
    if metadata is not None:
        result._metadata = metadata  # type: ignore[attr-defined]  # what torch's state_dict carries
    return result
