"""The instability guard's settings (``instability=ace3.InstabilityConfig(...)``): detect a
diverging optimizer step before its update and warn, skip it, roll back to the last checkpoint
with a lower learning rate, or stop. Kept apart so that the training schema stays readable;
``TrainingConfig`` inherits :class:`InstabilityFields`. What the engine does with them:
:mod:`ace3.runtime.loop.instability`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

InstabilityAction = Literal["warn", "skip", "rollback", "stop"]


class InstabilityConfig(BaseModel):
    """When an optimizer step is unstable, and what then happens.

    A step is unstable when (over every rank, decided before its update, the same on all):

    - its training loss is NaN or infinite;
    - its loss is above ``explosion_factor`` times the smallest loss of the last ``window``
      accepted steps (only while that minimum is positive: a loss that can be negative has no
      meaningful ratio);
    - its global gradient norm (unscaled, before clipping) is above ``max_grad_norm_spike``
      (an absolute threshold; None: not checked), or not finite while no loss scaler runs (the
      float16 loss scaler handles inf/NaN gradients itself by skipping the step).

    ``action``: ``"warn"`` records it and applies the step; ``"skip"`` drops the step's
    update (its gradients are zeroed and the optimizer does not step; the step still counts
    and the schedule advances); ``"rollback"`` drops the update, reloads the run's newest
    checkpoint and multiplies the learning rate by ``lr_factor`` (the factor persists in the
    checkpoints, so a resume keeps it); after ``max_rollbacks`` rollbacks the next instability
    stops the run; with no checkpoint written yet a rollback is refused: the run stops with
    the reason; ``"stop"`` fails the run with :class:`ace3.errors.InstabilityError`.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    action: InstabilityAction = Field("warn", description="warn, skip, rollback or stop.")
    window: int = Field(
        100, ge=1, le=100_000, description="Accepted steps whose minimum loss is the reference."
    )
    explosion_factor: float = Field(
        2.0, gt=1.0, le=1e6, allow_inf_nan=False,
        description="A loss above this times the recent minimum is an explosion.",
    )  # fmt: skip
    max_grad_norm_spike: float | None = Field(
        None, gt=0.0, allow_inf_nan=False,
        description="A global gradient norm above this is a spike (None: not checked).",
    )  # fmt: skip
    lr_factor: float = Field(
        0.5, gt=0.0, lt=1.0, description="A rollback multiplies the learning rate by this."
    )
    max_rollbacks: int = Field(
        3, ge=0, le=1000, description="Rollbacks allowed; the next instability stops the run."
    )


class InstabilityFields(BaseModel):
    """``instability``: the instability guard (see :class:`InstabilityConfig`; None: off)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    instability: InstabilityConfig | None = Field(
        None, description="Detect unstable steps (NaN, loss explosion, gradient spike)."
    )
