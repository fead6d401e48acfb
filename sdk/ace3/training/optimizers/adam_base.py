"""What both memory-saving Adams share: hyperparameter checks, a closure-aware ``step``, the AdamW
parameter update, and a ``load_state_dict`` that keeps each state tensor's dtype."""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import chain
from typing import Any

import torch

__all__ = ["Closure", "ExactStateOptimizer", "adamw_update", "check_adam_group", "denominator"]

Closure = Callable[[], Any] | None


def check_adam_group(group: dict[str, Any]) -> None:
    """Refuse hyperparameters Adam cannot run with, naming the argument."""
    lr = float(group["lr"])
    if not lr >= 0.0:
        raise ValueError(f"lr must be >= 0, got {group['lr']!r}")
    betas = group["betas"]
    if (
        not isinstance(betas, tuple | list)
        or len(betas) != 2
        or not all(isinstance(beta, int | float) and 0.0 <= beta < 1.0 for beta in betas)
    ):
        raise ValueError(f"betas must be two numbers in [0, 1), e.g. (0.9, 0.999), got {betas!r}")
    group["betas"] = (float(betas[0]), float(betas[1]))
    if not (isinstance(group["eps"], int | float) and group["eps"] >= 0.0):
        raise ValueError(f"eps must be a number >= 0 (e.g. 1e-8), got {group['eps']!r}")
    if not (isinstance(group["weight_decay"], int | float) and group["weight_decay"] >= 0.0):
        raise ValueError(f"weight_decay must be a number >= 0, got {group['weight_decay']!r}")


class ExactStateOptimizer(torch.optim.Optimizer):
    """Shared by both optimizers: a closure-aware ``step`` over parameters with gradients, the
    AdamW parameter update, and a ``load_state_dict`` that keeps each state tensor's dtype.

    ``torch.optim.Optimizer.load_state_dict`` casts every floating state tensor to its
    parameter's dtype, which would turn uint8 codes and bfloat16 moments into float32 (and
    round float32 state of a bfloat16 parameter). Here each tensor is restored as saved,
    copied onto its parameter's device, so a resumed run continues exactly.
    """

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        check_adam_group(self.param_groups[-1])

    @torch.no_grad()
    def step(self, closure: Closure = None) -> Any:
        """One Adam step for every parameter with a gradient; returns ``closure()`` if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                if param.grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
                self._update(param, group)
        return loss

    def _update(self, param: torch.Tensor, group: dict[str, Any]) -> None:
        raise NotImplementedError

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved_state = state_dict["state"]
        saved_ids = list(
            chain.from_iterable(group["params"] for group in state_dict["param_groups"])
        )
        super().load_state_dict(state_dict)
        params = chain.from_iterable(group["params"] for group in self.param_groups)
        for param_id, param in zip(saved_ids, params, strict=True):
            if param_id in saved_state:
                self.state[param] = {
                    key: _as_saved(value, param.device)
                    for key, value in saved_state[param_id].items()
                }


def _as_saved(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to(device=device, copy=True)
    return value


def adamw_update(
    param: torch.Tensor,
    exp_avg: torch.Tensor,
    denom: torch.Tensor,
    group: dict[str, Any],
    step: int,
) -> None:
    """``p <- p * (1 - lr * wd) - lr / (1 - beta1**step) * exp_avg / denom``, in float32.

    ``exp_avg`` and ``denom`` are float32 with ``param``'s number of elements; a bfloat16 or
    float16 parameter is updated in float32 and rounded once.
    """
    lr, weight_decay = float(group["lr"]), float(group["weight_decay"])
    beta1 = group["betas"][0]
    work = param if param.dtype == torch.float32 else param.float()
    if weight_decay != 0.0:
        work.mul_(1.0 - lr * weight_decay)
    step_size = lr / (1.0 - beta1**step)
    work.addcdiv_(exp_avg.reshape(param.shape), denom.reshape(param.shape), value=-step_size)
    if work is not param:
        param.copy_(work)


def denominator(exp_avg_sq: torch.Tensor, group: dict[str, Any], step: int) -> torch.Tensor:
    """``sqrt(v / (1 - beta2**step)) + eps``, computed as torch.optim.Adam does."""
    beta2 = group["betas"][1]
    return exp_avg_sq.sqrt().div_(math.sqrt(1.0 - beta2**step)).add_(group["eps"])
