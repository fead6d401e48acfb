"""The public loss scalers (dynamic, document-named dynamic, static) and the one a config asks for."""

from __future__ import annotations

import math
from typing import Literal

import torch

from ace3.config import AMPConfig, TrainingConfig
from ace3.training.amp.loss_scaler import (
    LossScaler,
    check_interval,
    positive_finite,
    read_only,
)

__all__ = ["DynamicLossScaler", "GradientScaler", "StaticLossScaler", "make_loss_scaler"]


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
        factor = positive_finite("scale_factor", scale_factor)
        if factor <= 1.0:
            raise ValueError(f"scale_factor must be > 1, got {scale_factor}")
        super().__init__(
            init_scale,
            dynamic=True,
            growth_factor=factor,
            backoff_factor=1.0 / factor,
            growth_interval=check_interval("scale_window", scale_window),
            min_scale=min_scale,
            max_scale=max_scale,
            enabled=enabled,
        )

    scale_factor = read_only("_growth_factor", "The factor the scale is divided/multiplied by.")
    scale_window = read_only("_growth_interval", "Clean steps before the scale grows.")


class StaticLossScaler(LossScaler):
    """One fixed loss scale; steps whose gradients overflow are still skipped."""

    def __init__(self, scale: float, enabled: bool = True) -> None:
        scale = positive_finite("scale", scale)
        super().__init__(
            scale, dynamic=False, min_scale=min(1.0, scale), max_scale=max(scale, 1.0),
            enabled=enabled,
        )  # fmt: skip


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
