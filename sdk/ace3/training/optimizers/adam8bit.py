""":class:`Adam8bit`: both Adam moments in 8 bits (blockwise quantization), or bitsandbytes' kernels
on CUDA."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import torch

from ace3.training.optimizers.adam_base import (
    Closure,
    ExactStateOptimizer,
    adamw_update,
    check_adam_group,
    denominator,
)
from ace3.training.optimizers.blockwise_8bit import dequantize_blockwise, quantize_blockwise

__all__ = ["Adam8bit"]


class Adam8bit(ExactStateOptimizer):
    """Adam (with decoupled weight decay) whose moments are stored in 8 bits.

    The method of Dettmers et al., "8-bit Optimizers via Block-wise Quantization" (2022):
    each moment is cut into blocks of ``block_size`` elements, each block scaled by its
    absolute maximum (float32) and every value stored as a uint8 index into a non-linear
    *dynamic* code (signed for the first moment, unsigned for the second; see
    ``ace3.training.optimizers.blockwise_8bit``). Each step dequantizes both moments to float32, performs Adam's
    update, and quantizes them back. Parameters with fewer than ``min_8bit_size`` elements
    (biases, norms) keep float32 moments, as bitsandbytes does: their state is small and they
    are sensitive to quantization. A ``256 x 256`` weight costs about ``2.03`` bytes per
    element instead of Adam's 8.

    ``weight_decay`` is decoupled: ``p <- p * (1 - lr * weight_decay)``, as in AdamW and in
    bitsandbytes' 8-bit Adam.

    Backend: with ``use_bitsandbytes=None`` (default), when every parameter is on a CUDA
    device and ``bitsandbytes`` imports, the work is handed to
    ``bitsandbytes.optim.Adam8bit(params, lr, betas, eps, weight_decay, min_8bit_size=...)``
    (its fused CUDA kernels and its own block size; ``block_size`` is then unused); otherwise
    this class's own implementation runs, on CPU or GPU. ``True`` requires bitsandbytes,
    ``False`` never uses it. The two backends' states are not interchangeable: a state dict
    loads into an optimizer using the same backend.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        *,
        block_size: int = 256,
        min_8bit_size: int = 4096,
        use_bitsandbytes: bool | None = None,
    ) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 2:
            raise ValueError(f"block_size must be an integer >= 2 (e.g. 256), got {block_size!r}")
        if (
            isinstance(min_8bit_size, bool)
            or not isinstance(min_8bit_size, int)
            or min_8bit_size < 0
        ):
            raise ValueError(f"min_8bit_size must be an integer >= 0, got {min_8bit_size!r}")
        if use_bitsandbytes not in (None, True, False):
            raise ValueError(
                f"use_bitsandbytes must be None, True or False, got {use_bitsandbytes!r}"
            )
        params = _materialised(params)
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "block_size": block_size,
            "min_8bit_size": min_8bit_size,
        }
        super().__init__(_materialised(params), defaults)
        self.use_bitsandbytes = use_bitsandbytes
        self._bnb: torch.optim.Optimizer | None = None
        bnb_optim = _bitsandbytes_optim(self._params(), use_bitsandbytes)
        if bnb_optim is not None:
            self._bnb = bnb_optim.Adam8bit(
                _materialised(params),
                lr=lr,
                betas=tuple(betas),
                eps=eps,
                weight_decay=weight_decay,
                min_8bit_size=min_8bit_size,
            )
            self._share_bnb_state()

    @property
    def backend(self) -> str:
        """``"bitsandbytes"`` or ``"ace3"``: which implementation runs the steps."""
        return "ace3" if self._bnb is None else "bitsandbytes"

    def _params(self) -> list[torch.Tensor]:
        return [param for group in self.param_groups for param in group["params"]]

    def _share_bnb_state(self) -> None:
        """Make this object's groups and state *be* bitsandbytes', so schedulers, zero_grad,
        checkpoints and ``optimizer_state_bytes`` see what actually runs."""
        assert self._bnb is not None
        self.param_groups = self._bnb.param_groups
        self.state = self._bnb.state
        self.defaults = self._bnb.defaults

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if getattr(self, "_bnb", None) is None:
            super().add_param_group(param_group)
            return
        self._bnb.add_param_group(param_group)  # type: ignore[union-attr]  # set: checked above
        check_adam_group(self.param_groups[-1])

    @torch.no_grad()
    def step(self, closure: Closure = None) -> Any:
        if self._bnb is not None:
            return self._bnb.step(closure)
        return super().step(closure)

    def state_dict(self) -> dict[str, Any]:
        if self._bnb is not None:
            return self._bnb.state_dict()
        return super().state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved_format = _state_format(state_dict)
        if saved_format is not None and saved_format != self.backend:
            raise ValueError(
                f"this Adam8bit state was written by the {saved_format} backend but this "
                f"optimizer uses the {self.backend} backend; build the optimizer with "
                f"use_bitsandbytes={saved_format == 'bitsandbytes'} (and the parameters on the "
                "same kind of device) to load it"
            )
        if self._bnb is not None:
            self._bnb.load_state_dict(state_dict)
            self._share_bnb_state()
            return
        super().load_state_dict(state_dict)

    def _init_state(self, param: torch.Tensor, group: dict[str, Any]) -> dict[str, Any]:
        numel = param.numel()
        if numel < group["min_8bit_size"]:
            return {
                "step": 0,
                "exp_avg": torch.zeros(numel, dtype=torch.float32, device=param.device),
                "exp_avg_sq": torch.zeros(numel, dtype=torch.float32, device=param.device),
            }
        zeros = torch.zeros(numel, dtype=torch.float32, device=param.device)
        m_codes, m_absmax = quantize_blockwise(zeros, group["block_size"], signed=True)
        v_codes, v_absmax = quantize_blockwise(zeros, group["block_size"], signed=False)
        return {
            "step": 0,
            "exp_avg_code": m_codes,
            "exp_avg_absmax": m_absmax,
            "exp_avg_sq_code": v_codes,
            "exp_avg_sq_absmax": v_absmax,
        }

    def _update(self, param: torch.Tensor, group: dict[str, Any]) -> None:
        state = self.state[param]
        if not state:
            state.update(self._init_state(param, group))
        state["step"] += 1
        step = state["step"]
        beta1, beta2 = group["betas"]
        block_size = group["block_size"]
        grad = param.grad.detach().float().reshape(-1)
        quantized = "exp_avg_code" in state
        if quantized:
            m_state = (state["exp_avg_code"], state["exp_avg_absmax"])
            v_state = (state["exp_avg_sq_code"], state["exp_avg_sq_absmax"])
            exp_avg = dequantize_blockwise(*m_state, block_size, signed=True)
            exp_avg_sq = dequantize_blockwise(*v_state, block_size, signed=False)
        else:
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.lerp_(grad, 1.0 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
        adamw_update(param, exp_avg, denominator(exp_avg_sq, group, step), group, step)
        if quantized:
            quantize_blockwise(exp_avg, block_size, signed=True, out=m_state)
            quantize_blockwise(exp_avg_sq, block_size, signed=False, out=v_state)


def _materialised(params: Iterable[Any]) -> list[Any]:
    """``params`` as a list whose group dicts are fresh copies with their parameters in lists:
    torch's ``add_param_group`` fills in (mutates) group dicts and consumes iterators, and
    Adam8bit hands the same groups to two optimizers when it delegates to bitsandbytes."""
    items = list(params)
    result: list[Any] = []
    for item in items:
        if isinstance(item, dict):
            group = dict(item)
            if "params" in group and not isinstance(group["params"], torch.Tensor):
                group["params"] = list(group["params"])
            result.append(group)
        else:
            result.append(item)
    return result


def _bitsandbytes_optim(params: list[torch.Tensor], wanted: bool | None) -> Any:
    """``bitsandbytes.optim`` when Adam8bit should delegate to it, else None."""
    if wanted is False:
        return None
    on_cuda = bool(params) and all(param.is_cuda for param in params)
    if not on_cuda:
        if wanted:
            raise ValueError(
                "use_bitsandbytes=True needs every parameter on a CUDA device; move the model "
                "to the GPU first, or leave use_bitsandbytes=None to use ACE3's implementation"
            )
        return None
    try:
        import bitsandbytes
    except Exception as exc:  # not installed, or installed without a working CUDA library
        if wanted:
            raise ValueError(
                f"use_bitsandbytes=True but bitsandbytes cannot be imported ({exc}); install "
                "it (pip install bitsandbytes) or leave use_bitsandbytes=None"
            ) from exc
        if not isinstance(exc, ModuleNotFoundError):
            warnings.warn(
                f"bitsandbytes is installed but failed to import ({exc}); Adam8bit uses "
                "ACE3's own 8-bit implementation instead",
                RuntimeWarning,
                stacklevel=3,
            )
        return None
    return bitsandbytes.optim


def _state_format(state_dict: dict[str, Any]) -> str | None:
    """Which Adam8bit backend wrote ``state_dict`` (None when it holds no state yet)."""
    for entry in state_dict.get("state", {}).values():
        if isinstance(entry, dict):
            if "state1" in entry:
                return "bitsandbytes"
            if "exp_avg" in entry or "exp_avg_code" in entry:
                return "ace3"
    return None
