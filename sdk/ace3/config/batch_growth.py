"""Batch-size growth (``dynamic_batch_size=ace3.DynamicBatchSizeConfig(...)``): start with a
small effective batch, grow it after ``stable_steps`` optimizer steps without instability or
out-of-memory, shrink it when either happens. Kept apart so that the training schema stays
readable; ``TrainingConfig.dynamic_batch_size`` holds ``bool | DynamicBatchSizeConfig``. What the
engine does with it: :mod:`ace3.runtime.loop.batch_growth`.

``dynamic_batch_size=True`` (the default) keeps the out-of-memory back-off alone (the micro-batch
halves, the effective batch stays); ``False`` (or ``DynamicBatchSizeConfig(enabled=False)``)
turns every dynamic behaviour off.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

LearningRateRule = Literal["none", "linear", "sqrt"]


class DynamicBatchSizeConfig(BaseModel):
    """The effective (global) batch follows a path from ``initial_batch_size``: multiplied by
    ``growth_factor`` after ``stable_steps`` optimizer steps in a row without instability (the
    instability guard, a step the loss scaler skipped) or out-of-memory, up to
    ``target_batch_size``; multiplied by ``shrink_factor`` (never below ``min_batch_size``) on
    out-of-memory or instability. Every size is a multiple of ``min_batch_size``, which is the
    job's ``batch_size`` (the loader's batch; it defaults to it): a step of size ``n x
    min_batch_size`` runs ``n`` loader batches concatenated into one micro-batch.

    ``scale_learning_rate``: how the learning rate follows the batch, relative to
    ``initial_batch_size``: ``"none"`` (it does not), ``"linear"`` (lr x size / initial, Goyal
    et al.) or ``"sqrt"`` (lr x sqrt(size / initial), for Adam-family optimizers). It multiplies
    whatever the schedule gives."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    enabled: bool = Field(True, description="False: no batch-size growth and no OOM back-off.")
    initial_batch_size: int = Field(32, ge=1, le=1_000_000, description="The first steps' batch.")
    target_batch_size: int = Field(128, ge=1, le=1_000_000, description="The largest batch.")
    min_batch_size: int = Field(
        8, ge=1, le=1_000_000, description="The smallest batch (and the loader's batch)."
    )
    growth_factor: float = Field(
        2.0, gt=1.0, le=64.0, allow_inf_nan=False, description="Multiply the batch when growing."
    )
    shrink_factor: float = Field(
        0.5, gt=0.0, lt=1.0, allow_inf_nan=False, description="Multiply the batch when shrinking."
    )
    stable_steps: int = Field(
        100, ge=1, le=10_000_000, description="Steps without trouble before the batch grows."
    )
    scale_learning_rate: LearningRateRule = Field(
        "none", description="How the lr follows the batch: none, linear or sqrt."
    )

    def __bool__(self) -> bool:
        return self.enabled

    @model_validator(mode="after")
    def _sizes_form_a_path(self) -> DynamicBatchSizeConfig:
        low, first, high = self.min_batch_size, self.initial_batch_size, self.target_batch_size
        if first < low:
            raise ValueError(f"initial_batch_size ({first}) must be >= min_batch_size ({low})")
        if high < first:
            raise ValueError(f"target_batch_size ({high}) must be >= initial_batch_size ({first})")
        for name, size in (("initial_batch_size", first), ("target_batch_size", high)):
            if size % low:
                raise ValueError(
                    f"{name} ({size}) must be a multiple of min_batch_size ({low}): a step runs "
                    "whole loader batches of min_batch_size samples"
                )
        return self


class HasDynamicBatchSize(Protocol):
    """What the helpers below read of a :class:`~ace3.config.training.TrainingConfig`."""

    @property
    def dynamic_batch_size(self) -> bool | DynamicBatchSizeConfig: ...


def batch_growth(config: HasDynamicBatchSize) -> DynamicBatchSizeConfig | None:
    """The growth settings when batch-size growth is on, else None."""
    value = config.dynamic_batch_size
    return value if isinstance(value, DynamicBatchSizeConfig) and value.enabled else None


def recovers_from_oom(config: HasDynamicBatchSize) -> bool:
    """Whether an out-of-memory step is retried with a smaller micro-batch (``True`` or growth
    on)."""
    return bool(config.dynamic_batch_size)


def batch_size_from_growth(data: Any) -> Any:
    """Before validation: with growth on and no ``batch_size``, the loader's batch is
    ``min_batch_size``."""
    if not isinstance(data, Mapping) or "batch_size" in data:
        return data
    growth = data.get("dynamic_batch_size")
    if isinstance(growth, Mapping):
        if not growth.get("enabled", True):
            return data
        low = growth.get(
            "min_batch_size", DynamicBatchSizeConfig.model_fields["min_batch_size"].default
        )
    elif isinstance(growth, DynamicBatchSizeConfig) and growth.enabled:
        low = growth.min_batch_size
    else:
        return data
    return {**data, "batch_size": low} if isinstance(low, int) else data
