"""Mixed-precision settings of :class:`~ace3.config.training.TrainingConfig` (autocast, the
AMP level, loss scaling). Kept apart so that the training schema stays readable;
``TrainingConfig`` inherits :class:`PrecisionFields`. What the engine does with them:
:mod:`ace3.runtime.loop.precision`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

AmpLevel = Literal["O0", "O1", "O2", "O3"]
AmpDtype = Literal["auto", "float16", "bfloat16"]


class PrecisionFields(BaseModel):
    """``mixed_precision``, ``amp_dtype``, ``amp_level`` and the loss-scaling fields."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    mixed_precision: bool = Field(False, description="Autocast forward passes to a 16-bit type.")
    amp_dtype: AmpDtype = Field(
        "auto", description="auto = bfloat16 where supported (CPU, Ampere+), else float16."
    )
    amp_level: AmpLevel = Field("O1", description="O0 fp32, O1 autocast; O2/O3 cast weights too.")
    loss_scaling: Literal["dynamic", "static"] | float = Field(
        "dynamic",
        description="Loss scaling for float16: dynamic, static (init_loss_scale) or a fixed value.",
    )
    keep_batchnorm_fp32: bool | None = Field(
        None, description="O2/O3: keep BatchNorm in float32 (default: True for O2, False for O3)."
    )
    init_loss_scale: float = Field(2.0**16, gt=0.0, description="First loss scale.")
    loss_scale_growth_factor: float = Field(
        2.0, gt=1.0, description="Dynamic scaling: multiply the scale after a clean window."
    )
    loss_scale_backoff_factor: float = Field(
        0.5, gt=0.0, lt=1.0, description="Dynamic scaling: multiply the scale on overflow."
    )
    loss_scale_window: int = Field(
        2000, ge=1, description="Dynamic scaling: overflow-free steps before the scale grows."
    )
    min_loss_scale: float = Field(1.0, gt=0.0, description="Dynamic scaling: lower bound.")
    max_loss_scale: float = Field(2.0**24, gt=0.0, description="Dynamic scaling: upper bound.")
