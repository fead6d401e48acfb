"""Mixed precision for your own loops: ``autocast`` and the loss scalers.

The document's loops run as written::

    scaler = ace3.GradientScaler(init_scale=65536.0, growth_factor=2.0,
                                 backoff_factor=0.5, growth_interval=2000)
    for batch in dataloader:
        with ace3.autocast():
            loss = model(batch)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

A loss scaler multiplies the loss before ``backward()`` so that small float16 gradients do not
underflow to zero, divides the gradients back before the optimizer sees them, and skips any
step whose gradients overflowed (inf/NaN). :class:`GradientScaler` and
:class:`DynamicLossScaler` adapt the scale (back off on overflow, grow after a window of clean
steps, always within ``[min_scale, max_scale]``); :class:`StaticLossScaler` keeps one scale.
Under ``torch.distributed`` every rank skips the same steps (the overflow flag is all-reduced).

bfloat16 has float32's exponent range and needs no scaling: :func:`make_loss_scaler` turns
scaling on for float16 only. The training engine uses these same classes.

This module imports torch; ``import ace3`` does not load it until one of these names is used.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

import torch
import torch.distributed as dist

from ace3.config import AMPConfig, TrainingConfig

__all__ = [
    "DynamicLossScaler",
    "GradientScaler",
    "LossScaler",
    "StaticLossScaler",
    "autocast",
    "make_loss_scaler",
    "resolve_amp_dtype",
]

_DTYPE_NAMES: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}

LossT = TypeVar("LossT")


# -- dtype and autocast -------------------------------------------------------------------------
def _default_device_type() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _cuda_has_native_bf16() -> bool:
    """bfloat16 in hardware (Ampere and newer); emulated bfloat16 on older GPUs is slow."""
    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # torch before 2.3 has no including_emulation and never emulates
        return bool(torch.cuda.is_bf16_supported())


def resolve_amp_dtype(
    choice: str | torch.dtype | None = "auto", device_type: str | None = None
) -> torch.dtype:
    """The 16-bit dtype for ``choice`` on ``device_type`` (the config's ``amp_dtype`` rule).

    ``"auto"`` (or None): bfloat16 on CPU and on CUDA GPUs that support it (Ampere and newer),
    float16 on older GPUs and other devices. ``"float16"``/``"bfloat16"`` (or the torch dtypes)
    are taken as given.
    """
    device_type = device_type or _default_device_type()
    if choice is None or choice == "auto":
        if device_type == "cpu":
            return torch.bfloat16
        if device_type == "cuda":
            return torch.bfloat16 if _cuda_has_native_bf16() else torch.float16
        return torch.float16
    if isinstance(choice, torch.dtype):
        if choice in (torch.float16, torch.bfloat16):
            return choice
        raise ValueError(
            f"dtype={choice} is not a 16-bit autocast type: use torch.float16 or torch.bfloat16"
        )
    if isinstance(choice, str) and choice.lower() in _DTYPE_NAMES:
        return _DTYPE_NAMES[choice.lower()]
    raise ValueError(
        f"dtype={choice!r} is not a 16-bit autocast type: use 'auto', 'float16' or 'bfloat16' "
        "(or torch.float16 / torch.bfloat16)"
    )


def autocast(
    enabled: bool = True,
    dtype: str | torch.dtype | None = None,
    device_type: str | None = None,
) -> torch.autocast:
    """A ``torch.autocast`` context (also usable as a decorator) with ACE3's defaults.

    ``device_type`` defaults to ``"cuda"`` when CUDA is available, else ``"cpu"``; ``dtype``
    defaults to bfloat16 on CPU and on GPUs that support it, float16 otherwise (the rule of
    ``TrainingConfig(amp_dtype="auto")``). ``enabled=False`` runs the block in full precision.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be True or False, got {enabled!r}")
    if device_type is None:
        device_type = _default_device_type()
    elif not isinstance(device_type, str) or not device_type:
        raise ValueError(
            f"device_type must be a device name such as 'cuda' or 'cpu', got {device_type!r}"
        )
    if enabled and device_type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            "device_type='cuda' but CUDA is not available in this process: use "
            "device_type='cpu' or leave device_type unset"
        )
    return torch.autocast(
        device_type=device_type, dtype=resolve_amp_dtype(dtype, device_type), enabled=enabled
    )


# -- argument checks ----------------------------------------------------------------------------
def _positive_finite(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return value


def _check_interval(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1 (steps), got {value!r}")
    return value


# -- gradient unscaling -------------------------------------------------------------------------
def _collective_device(local: torch.device) -> torch.device:
    """Where the overflow flag must live for the default process group's backend."""
    backend = str(dist.get_backend())
    if ":" in backend:  # a per-device mapping such as "cpu:gloo,cuda:nccl"
        return local if f"{local.type}:" in backend else torch.device("cpu")
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _any_rank(found: bool, device: torch.device) -> bool:
    """True when ``found`` is True on any rank of the default process group (a collective)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() <= 1:
        return found
    flag = torch.tensor([1.0 if found else 0.0], device=_collective_device(device))
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item() > 0.0)


def _unscale_grads(grads: list[torch.Tensor], inv_scale: float) -> tuple[bool, torch.device]:
    """Multiply ``grads`` in place by ``inv_scale``; True when any of them holds inf/NaN.

    Grads are grouped by device and dtype and handled by torch's fused check-and-unscale
    kernel (one launch per group, the kernel torch's own GradScaler uses). One host sync.
    """
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for grad in grads:
        groups.setdefault((grad.device, grad.dtype), []).append(grad)
    flags: list[torch.Tensor] = []
    for (device, _dtype), tensors in groups.items():
        found = torch.zeros(1, dtype=torch.float32, device=device)
        inv = torch.full((1,), inv_scale, dtype=torch.float32, device=device)
        torch._amp_foreach_non_finite_check_and_unscale_(tensors, found, inv)
        flags.append(found)
    if not flags:
        return False, torch.device("cpu")
    first = flags[0].device
    total = torch.stack([flag.to(first) for flag in flags]).sum()
    return bool(total.item() > 0.0), first


def _optimizer_grads(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The gradient tensors to unscale (sparse gradients are coalesced, their values used)."""
    grads = []
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is None:
                continue
            if param.grad.is_sparse:
                if param.grad.dtype is torch.float16:
                    param.grad = param.grad.coalesce()  # duplicates could sum past float16's max
                grads.append(param.grad._values())
            else:
                grads.append(param.grad)
    return grads


def _check_loss(loss: Any) -> None:
    if isinstance(loss, torch.Tensor):
        return
    if isinstance(loss, (list, tuple)) and all(isinstance(x, torch.Tensor) for x in loss):
        return
    raise TypeError(
        f"loss must be a torch.Tensor (or a list/tuple of tensors), got {type(loss).__name__}"
    )


def _check_optimizer(optimizer: Any) -> None:
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}"
        )


# -- the scalers --------------------------------------------------------------------------------
class LossScaler:
    """Loss scaling with overflow detection; the base of the public scalers.

    Per optimizer step: ``scale(loss).backward()`` (once per micro-batch), optionally
    ``unscale_(optimizer)`` (before clipping), then ``step(optimizer)`` and ``update()``.

    ``dynamic=True``: an overflowing step multiplies the scale by ``backoff_factor`` (not below
    ``min_scale``) and restarts the count of clean steps; after ``growth_interval`` consecutive
    clean steps the scale is multiplied by ``growth_factor`` (not above ``max_scale``).
    ``dynamic=False``: the scale never changes. Either way an overflowing step is skipped.
    ``enabled=False``: a pass-through (no scaling, no checks, ``step`` just steps).
    """

    def __init__(
        self,
        init_scale: float,
        *,
        dynamic: bool,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        min_scale: float = 1.0,
        max_scale: float = 2.0**24,
        enabled: bool = True,
    ) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(f"enabled must be True or False, got {enabled!r}")
        init_scale = _positive_finite("init_scale", init_scale)
        self._growth_factor = _positive_finite("growth_factor", growth_factor)
        if self._growth_factor <= 1.0:
            raise ValueError(f"growth_factor must be > 1 (the scale grows), got {growth_factor}")
        self._backoff_factor = _positive_finite("backoff_factor", backoff_factor)
        if self._backoff_factor >= 1.0:
            raise ValueError(
                f"backoff_factor must be in (0, 1) (the scale shrinks), got {backoff_factor}"
            )
        self._growth_interval = _check_interval("growth_interval", growth_interval)
        self._min_scale = _positive_finite("min_scale", min_scale)
        self._max_scale = _positive_finite("max_scale", max_scale)
        if self._min_scale > self._max_scale:
            raise ValueError(
                f"min_scale ({min_scale}) must not exceed max_scale ({max_scale}): "
                "lower min_scale or raise max_scale"
            )
        self._dynamic = dynamic
        self._enabled = enabled
        # A dynamic scale always stays within [min_scale, max_scale], the first one included.
        self._scale = self._clamp(init_scale) if dynamic else init_scale
        self._growth_tracker = 0
        self._skipped_steps = 0
        self._last_step_skipped = False
        # Per optimizer (by id) since the last update(): its grads were unscaled; it overflowed.
        self._unscaled: dict[int, bool] = {}

    # -- read-only state ------------------------------------------------------------------------
    def is_enabled(self) -> bool:
        """False for a pass-through scaler (bfloat16, float32, or ``enabled=False``)."""
        return self._enabled

    @property
    def dynamic(self) -> bool:
        """True when the scale adapts to overflows; False for a fixed scale."""
        return self._dynamic

    def get_scale(self) -> float:
        """The current loss scale (1.0 when disabled)."""
        return self._scale if self._enabled else 1.0

    @property
    def skipped_steps(self) -> int:
        """How many ``step(optimizer)`` calls skipped the optimizer because of inf/NaN grads."""
        return self._skipped_steps

    @property
    def last_step_skipped(self) -> bool:
        """Whether the most recent ``step(optimizer)`` skipped the optimizer."""
        return self._last_step_skipped

    @property
    def growth_tracker(self) -> int:
        """Consecutive clean steps since the scale last changed (dynamic scaling)."""
        return self._growth_tracker

    # -- the step -------------------------------------------------------------------------------
    def scale(self, loss: LossT) -> LossT:
        """``loss * scale`` (a tensor, or a list/tuple of tensors; 16-bit losses become
        float32); ``loss`` itself when disabled."""
        _check_loss(loss)
        if not self._enabled:
            return loss
        if isinstance(loss, torch.Tensor):
            return self._scaled(loss)  # type: ignore[return-value]
        return type(loss)(self._scaled(item) for item in loss)  # type: ignore[call-arg,arg-type,union-attr]

    def _scaled(self, loss: torch.Tensor) -> torch.Tensor:
        # A 16-bit loss is scaled in float32: 65536 * a float16 loss of 2 is already inf.
        if loss.dtype in (torch.float16, torch.bfloat16):
            loss = loss.float()
        return loss * self._scale

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the grads of ``optimizer``'s parameters by the scale, once per step.

        Call it before clipping gradients so the clip threshold applies to the true gradients.
        Records whether any grad is inf/NaN; under ``torch.distributed`` the flag is
        all-reduced (MAX) so every rank skips the same steps: every rank must call it.
        """
        _check_optimizer(optimizer)
        if not self._enabled:
            return
        key = id(optimizer)
        if key in self._unscaled:
            raise RuntimeError(
                "unscale_(optimizer) was already called for this optimizer since the last "
                "update(): call it at most once per step, before step(optimizer)"
            )
        found, device = _unscale_grads(_optimizer_grads(optimizer), 1.0 / self._scale)
        self._unscaled[key] = _any_rank(found, device)

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        """Unscale (if not done yet) and run ``optimizer.step(*args, **kwargs)``, unless a grad
        overflowed: then the step is skipped and None is returned."""
        _check_optimizer(optimizer)
        if not self._enabled:
            self._last_step_skipped = False
            return optimizer.step(*args, **kwargs)
        if kwargs.get("closure") is not None or (args and callable(args[0])):
            raise ValueError(
                "step(optimizer, closure) is not supported with loss scaling: the closure's loss "
                "would not be scaled; call scale(loss).backward() yourself, then step(optimizer)"
            )
        if id(optimizer) not in self._unscaled:
            self.unscale_(optimizer)
        if self._unscaled[id(optimizer)]:
            self._skipped_steps += 1
            self._last_step_skipped = True
            return None
        self._last_step_skipped = False
        return optimizer.step(*args, **kwargs)

    def update(self) -> None:
        """Adjust the scale after the step (dynamic) and reset the per-step state."""
        if not self._enabled:
            return
        if not self._unscaled:
            raise RuntimeError(
                "update() needs a step(optimizer) (or unscale_(optimizer)) since the last "
                "update(): call scaler.step(optimizer) first"
            )
        overflow = any(self._unscaled.values())
        self._unscaled.clear()
        if not self._dynamic:
            return
        if overflow:
            self._scale = self._clamp(self._scale * self._backoff_factor)
            self._growth_tracker = 0
            return
        self._growth_tracker += 1
        if self._growth_tracker >= self._growth_interval:
            self._scale = self._clamp(self._scale * self._growth_factor)
            self._growth_tracker = 0

    def abandon_step(self) -> None:
        """Forget an ``unscale_`` whose step will not happen (a step retried after an error)."""
        self._unscaled.clear()

    def _clamp(self, scale: float) -> float:
        return min(self._max_scale, max(self._min_scale, scale))

    # -- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain Python values (safe for ``torch.load(weights_only=True)``)."""
        return {
            "kind": "dynamic" if self._dynamic else "static",
            "enabled": self._enabled,
            "scale": self._scale,
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "min_scale": self._min_scale,
            "max_scale": self._max_scale,
            "growth_tracker": self._growth_tracker,
            "skipped_steps": self._skipped_steps,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the scale, the clean-step count and the skip counter.

        The factors, interval and bounds stay the ones this scaler was built with (a resumed
        run may change them); a dynamic scale is clamped into the current bounds; a static
        scaler keeps its own scale. Also reads ``torch.amp.GradScaler`` state dicts.
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a mapping (a state_dict()), got {type(state).__name__}")
        if "scale" not in state:
            raise ValueError(
                "state has no 'scale': pass a dict returned by a loss scaler's state_dict()"
            )
        scale = _positive_finite("state['scale']", float(state["scale"]))
        if self._dynamic:
            self._scale = self._clamp(scale)
        tracker = state.get("growth_tracker", state.get("_growth_tracker", 0))
        self._growth_tracker = int(tracker)
        self._skipped_steps = int(state.get("skipped_steps", 0))
        self._last_step_skipped = False
        self._unscaled.clear()

    def __repr__(self) -> str:
        if not self._enabled:
            return f"{type(self).__name__}(enabled=False)"
        return f"{type(self).__name__}(scale={self._scale:g}, skipped_steps={self._skipped_steps})"


class GradientScaler(LossScaler):
    """Dynamic loss scaling with the names of ``torch.amp.GradScaler``, plus bounds.

    On an overflowing step: the step is skipped and ``scale *= backoff_factor`` (not below
    ``min_scale``). After ``growth_interval`` consecutive clean steps: ``scale *=
    growth_factor`` (not above ``max_scale``).
    """

    def __init__(
        self,
        init_scale: float = 65536.0,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        min_scale: float = 1.0,
        max_scale: float = 2.0**24,
        enabled: bool = True,
    ) -> None:
        super().__init__(
            init_scale,
            dynamic=True,
            growth_factor=growth_factor,
            backoff_factor=backoff_factor,
            growth_interval=growth_interval,
            min_scale=min_scale,
            max_scale=max_scale,
            enabled=enabled,
        )


class DynamicLossScaler(LossScaler):
    """Dynamic loss scaling with the document's names: the scale is divided by
    ``scale_factor`` on overflow and multiplied by it after ``scale_window`` clean steps."""

    def __init__(
        self,
        init_scale: float = 2.0**16,
        scale_factor: float = 2.0,
        scale_window: int = 2000,
        min_scale: float = 1.0,
        max_scale: float = 2.0**24,
        enabled: bool = True,
    ) -> None:
        factor = _positive_finite("scale_factor", scale_factor)
        if factor <= 1.0:
            raise ValueError(f"scale_factor must be > 1, got {scale_factor}")
        super().__init__(
            init_scale,
            dynamic=True,
            growth_factor=factor,
            backoff_factor=1.0 / factor,
            growth_interval=_check_interval("scale_window", scale_window),
            min_scale=min_scale,
            max_scale=max_scale,
            enabled=enabled,
        )

    @property
    def scale_factor(self) -> float:
        return self._growth_factor

    @property
    def scale_window(self) -> int:
        return self._growth_interval


class StaticLossScaler(LossScaler):
    """One fixed loss scale; steps whose gradients overflow are still skipped."""

    def __init__(self, scale: float, enabled: bool = True) -> None:
        scale = _positive_finite("scale", scale)
        super().__init__(
            scale, dynamic=False, min_scale=min(1.0, scale), max_scale=max(scale, 1.0),
            enabled=enabled,
        )  # fmt: skip


# -- from a config ------------------------------------------------------------------------------
def make_loss_scaler(config: TrainingConfig | AMPConfig, dtype: torch.dtype | None) -> LossScaler:
    """The scaler a config asks for, enabled only when ``dtype`` is float16.

    ``loss_scaling="dynamic"``: :class:`GradientScaler` from ``init_loss_scale``,
    ``loss_scale_growth_factor``, ``loss_scale_backoff_factor``, ``loss_scale_window``,
    ``min_loss_scale`` and ``max_loss_scale``. ``"static"``: ``StaticLossScaler(init_loss_scale)``.
    A number: ``StaticLossScaler(number)``. ``dtype`` None (float32) or bfloat16: the same
    scaler, disabled (a pass-through), so a training loop has one code path.
    """
    if isinstance(config, AMPConfig):
        config = TrainingConfig(**config.training_fields())
    if not isinstance(config, TrainingConfig):
        raise TypeError(
            f"config must be an ace3.TrainingConfig or ace3.AMPConfig, got {type(config).__name__}"
        )
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype or None, got {type(dtype).__name__}")
    enabled = dtype == torch.float16
    mode: Literal["dynamic", "static"] | float = config.loss_scaling
    if mode == "dynamic":
        if config.min_loss_scale > config.max_loss_scale:
            raise ValueError(
                f"min_loss_scale ({config.min_loss_scale}) must not exceed max_loss_scale "
                f"({config.max_loss_scale})"
            )
        return GradientScaler(
            init_scale=config.init_loss_scale,
            growth_factor=config.loss_scale_growth_factor,
            backoff_factor=config.loss_scale_backoff_factor,
            growth_interval=config.loss_scale_window,
            min_scale=config.min_loss_scale,
            max_scale=config.max_loss_scale,
            enabled=enabled,
        )
    if mode == "static":
        return StaticLossScaler(config.init_loss_scale, enabled=enabled)
    if isinstance(mode, str) or not math.isfinite(mode) or mode <= 0.0:
        raise ValueError(
            f"loss_scaling={mode!r}: use 'dynamic', 'static' or a fixed scale (a number > 0)"
        )
    return StaticLossScaler(float(mode), enabled=enabled)
