"""Memory-saving Adam optimizers: ``ace3.training.optimizers`` (imports torch; ``import ace3`` does not).

Both are real :class:`torch.optim.Optimizer` subclasses with Adam's update and *decoupled*
(AdamW-style) weight decay, ``p <- p * (1 - lr * weight_decay)`` before the Adam step. They
differ from ``torch.optim.Adam`` only in how they store the two moments between steps:

- :class:`MemoryEfficientAdam`: first moment in bfloat16, second moment factored into row and
  column statistics (Adafactor) for matrices; about a quarter of Adam's state for big layers.
- :class:`Adam8bit`: both moments as uint8 codes with blockwise float32 scales (Dettmers et
  al.); about a quarter of Adam's state. On CUDA with ``bitsandbytes`` installed it hands the
  work to ``bitsandbytes.optim.Adam8bit``.

Each step reads the stored state, computes the update in float32, and writes the state back;
``state_dict()``/``load_state_dict()`` round-trip exactly (a resumed run continues bit for bit).

:func:`optimizer_state_bytes` measures what an optimizer keeps; :func:`optimizer_settings`
turns a client-built optimizer into the ``TrainingConfig`` fields that rebuild it in a job.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Iterator
from itertools import chain
from typing import Any

import torch

from ace3.config.optimizer_settings import optimizer_settings
from ace3.training._blockwise_8bit import dequantize_blockwise, quantize_blockwise

__all__ = ["Adam8bit", "MemoryEfficientAdam", "optimizer_settings", "optimizer_state_bytes"]

Closure = Callable[[], Any] | None


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes held by every tensor in ``optimizer.state`` (each tensor counted once)."""
    seen: set[int] = set()
    total = 0
    for value in _tensors(optimizer.state.values()):
        if id(value) not in seen:
            seen.add(id(value))
            total += value.numel() * value.element_size()
    return total


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, list | tuple) or type(value).__name__ == "dict_values":
        for item in value:
            yield from _tensors(item)


def _check_adam_group(group: dict[str, Any]) -> None:
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


class _ExactStateOptimizer(torch.optim.Optimizer):
    """Shared by both optimizers: a closure-aware ``step`` over parameters with gradients, the
    AdamW parameter update, and a ``load_state_dict`` that keeps each state tensor's dtype.

    ``torch.optim.Optimizer.load_state_dict`` casts every floating state tensor to its
    parameter's dtype, which would turn uint8 codes and bfloat16 moments into float32 (and
    round float32 state of a bfloat16 parameter). Here each tensor is restored as saved,
    copied onto its parameter's device, so a resumed run continues exactly.
    """

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        _check_adam_group(self.param_groups[-1])

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


def _adamw_update(
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


def _denominator(exp_avg_sq: torch.Tensor, group: dict[str, Any], step: int) -> torch.Tensor:
    """``sqrt(v / (1 - beta2**step)) + eps``, computed as torch.optim.Adam does."""
    beta2 = group["betas"][1]
    return exp_avg_sq.sqrt().div_(math.sqrt(1.0 - beta2**step)).add_(group["eps"])


class MemoryEfficientAdam(_ExactStateOptimizer):
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
            _adamw_update(param, exp_avg, _denominator(exp_avg_sq, group, step), group, step)
            return
        row, col = state["exp_avg_sq_row"], state["exp_avg_sq_col"]
        grad = grad.reshape(row.numel(), col.numel())
        exp_avg = state["exp_avg"].float().reshape(grad.shape)
        exp_avg.lerp_(grad, 1.0 - beta1)
        squared = grad.square()
        row.mul_(beta2).add_(squared.mean(dim=1), alpha=1.0 - beta2)
        col.mul_(beta2).add_(squared.mean(dim=0), alpha=1.0 - beta2)
        exp_avg_sq = torch.outer(row, col).div_(row.mean().clamp_min(torch.finfo(row.dtype).tiny))
        _adamw_update(param, exp_avg, _denominator(exp_avg_sq, group, step), group, step)
        state["exp_avg"].copy_(exp_avg.reshape(param.shape))


class Adam8bit(_ExactStateOptimizer):
    """Adam (with decoupled weight decay) whose moments are stored in 8 bits.

    The method of Dettmers et al., "8-bit Optimizers via Block-wise Quantization" (2022):
    each moment is cut into blocks of ``block_size`` elements, each block scaled by its
    absolute maximum (float32) and every value stored as a uint8 index into a non-linear
    *dynamic* code (signed for the first moment, unsigned for the second; see
    ``ace3.training._blockwise_8bit``). Each step dequantizes both moments to float32, performs Adam's
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
        self._bnb.add_param_group(param_group)
        _check_adam_group(self.param_groups[-1])

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
        _adamw_update(param, exp_avg, _denominator(exp_avg_sq, group, step), group, step)
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
