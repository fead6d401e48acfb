"""The loss scaler's machinery (:class:`LossScaler`): scale the loss, unscale and check the grads,
skip overflowing steps, adapt the scale, and save/restore it in checkpoints."""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from typing import Any, TypeVar

import torch

from ace3.training.amp.unscaling import any_rank, optimizer_grads, unscale_grads

__all__ = ["LossScaler", "check_interval", "positive_finite", "read_only"]

LossT = TypeVar("LossT")


def read_only(attribute: str, doc: str) -> property:
    """A read-only property that returns ``self.<attribute>``."""
    return property(operator.attrgetter(attribute), doc=doc)


def positive_finite(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return value


def check_interval(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1 (steps), got {value!r}")
    return value


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
        init_scale = positive_finite("init_scale", init_scale)
        self._growth_factor = positive_finite("growth_factor", growth_factor)
        if self._growth_factor <= 1.0:
            raise ValueError(f"growth_factor must be > 1 (the scale grows), got {growth_factor}")
        self._backoff_factor = positive_finite("backoff_factor", backoff_factor)
        if self._backoff_factor >= 1.0:
            raise ValueError(
                f"backoff_factor must be in (0, 1) (the scale shrinks), got {backoff_factor}"
            )
        self._growth_interval = check_interval("growth_interval", growth_interval)
        self._min_scale = positive_finite("min_scale", min_scale)
        self._max_scale = positive_finite("max_scale", max_scale)
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

    dynamic = read_only(
        "_dynamic", "True when the scale adapts to overflows; False for a fixed scale."
    )

    def get_scale(self) -> float:
        """The current loss scale (1.0 when disabled)."""
        return self._scale if self._enabled else 1.0

    skipped_steps = read_only(
        "_skipped_steps",
        "How many ``step(optimizer)`` calls skipped the optimizer because of inf/NaN grads.",
    )

    last_step_skipped = read_only(
        "_last_step_skipped", "Whether the most recent ``step(optimizer)`` skipped the optimizer."
    )

    growth_tracker = read_only(
        "_growth_tracker", "Consecutive clean steps since the scale last changed (dynamic scaling)."
    )

    # -- the step -------------------------------------------------------------------------------
    def scale(self, loss: LossT) -> LossT:
        """``loss * scale`` (a tensor, or a list/tuple of tensors; 16-bit losses become
        float32); ``loss`` itself when disabled."""
        _check_loss(loss)
        if not self._enabled:
            return loss
        if isinstance(loss, torch.Tensor):
            return self._scaled(loss)
        return type(loss)(self._scaled(item) for item in loss)  # type: ignore[call-arg,attr-defined]  # a list or tuple of tensors here (_check_loss), rebuilt as its own type

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
        found, device = unscale_grads(optimizer_grads(optimizer), 1.0 / self._scale)
        self._unscaled[key] = any_rank(found, device)

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
        scale = positive_finite("state['scale']", float(state["scale"]))
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
