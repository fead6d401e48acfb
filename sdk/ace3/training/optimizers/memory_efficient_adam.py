""":class:`MemoryEfficientAdam`: a bfloat16 first moment and an Adafactor-factored second moment."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ace3.training.optimizers.adam_base import ExactStateOptimizer, adamw_update, denominator

__all__ = ["MemoryEfficientAdam"]


class MemoryEfficientAdam(ExactStateOptimizer):
    """Adam (with decoupled weight decay) that keeps about a quarter of Adam's state.

    Design, per parameter:

    - **Matrices and higher** (``ndim >= 2``, viewed as ``shape[0]`` rows by the rest as
      columns, so a conv kernel's rows are its output channels): the first moment is stored in
      **bfloat16** (2 bytes instead of 4; each step widens it to float32, updates it and rounds
      it back once), and the second moment is **factored** as in Adafactor (Shazeer & Stern,
      2018): an exponential average of the row means and one of the column means of
      ``grad**2``, in float32, rebuilt each step as ``v = outer(row, col) / mean(row)``. An
      ``n x m`` weight costs ``2nm + 4(n + m)`` bytes instead of ``8nm``.
    - **Vectors, scalars** (biases, norms) and matrices with one row or one column: full
      float32 moments, exactly ``torch.optim.AdamW``'s update.

    Bias correction is Adam's: ``m / (1 - beta1**t)`` and ``v / (1 - beta2**t)`` (the factored
    statistics are zero-initialised averages too, and ``outer(row, col) / mean(row)`` is
    homogeneous of degree one, so one correction of ``v`` is exact). ``weight_decay`` is
    decoupled: ``p <- p * (1 - lr * weight_decay)`` before the step, as in AdamW.

    The update is computed in float32 with temporary buffers for one parameter at a time, so
    the saving is in what persists between steps (see ``optimizer_state_bytes``). Runs on any
    device with plain torch operations.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)

    @staticmethod
    def _factored_shape(param: torch.Tensor) -> tuple[int, int] | None:
        if param.dim() < 2 or param.numel() == 0:
            return None
        rows = param.shape[0]
        cols = param.numel() // rows
        return (rows, cols) if rows > 1 and cols > 1 else None

    def _init_state(self, param: torch.Tensor) -> dict[str, Any]:
        shape = self._factored_shape(param)
        options = {"device": param.device}
        if shape is None:
            return {
                "step": 0,
                "exp_avg": torch.zeros(param.shape, dtype=torch.float32, **options),
                "exp_avg_sq": torch.zeros(param.shape, dtype=torch.float32, **options),
            }
        rows, cols = shape
        return {
            "step": 0,
            "exp_avg": torch.zeros(param.shape, dtype=torch.bfloat16, **options),
            "exp_avg_sq_row": torch.zeros(rows, dtype=torch.float32, **options),
            "exp_avg_sq_col": torch.zeros(cols, dtype=torch.float32, **options),
        }

    def _update(self, param: torch.Tensor, group: dict[str, Any]) -> None:
        state = self.state[param]
        if not state:
            state.update(self._init_state(param))
        state["step"] += 1
        step = state["step"]
        beta1, beta2 = group["betas"]
        grad = param.grad.detach().float()
        if "exp_avg_sq" in state:  # full float32 moments
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            exp_avg.lerp_(grad, 1.0 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
            adamw_update(param, exp_avg, denominator(exp_avg_sq, group, step), group, step)
            return
        row, col = state["exp_avg_sq_row"], state["exp_avg_sq_col"]
        grad = grad.reshape(row.numel(), col.numel())
        exp_avg = state["exp_avg"].float().reshape(grad.shape)
        exp_avg.lerp_(grad, 1.0 - beta1)
        squared = grad.square()
        row.mul_(beta2).add_(squared.mean(dim=1), alpha=1.0 - beta2)
        col.mul_(beta2).add_(squared.mean(dim=0), alpha=1.0 - beta2)
        exp_avg_sq = torch.outer(row, col).div_(row.mean().clamp_min(torch.finfo(row.dtype).tiny))
        adamw_update(param, exp_avg, denominator(exp_avg_sq, group, step), group, step)
        state["exp_avg"].copy_(exp_avg.reshape(param.shape))
