"""The optimizer steps of a whole fresh run (what schedules without a horizon use): the plan
of :func:`ace3.runtime.loop.step_counts.planned_total_steps`, or batch-size growth's path."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ace3.config import TrainingConfig
from ace3.config.batch_growth import batch_growth
from ace3.runtime.loop.batch_growth import grown_path_steps
from ace3.runtime.loop.step_counts import planned_total_steps
from ace3.runtime.loop.train_state import TrainState

if TYPE_CHECKING:
    from ace3.runtime.data.train_source import TrainData


def total_optimizer_steps(config: TrainingConfig, data: TrainData) -> int:
    """Optimizer steps of a whole fresh run: the plan of :func:`planned_total_steps` from step
    0; with batch-size growth, the steps of its path
    (:func:`ace3.runtime.loop.batch_growth.grown_path_steps`). A cycling stream's run is one
    epoch of ``max_steps`` steps (:mod:`ace3.runtime.data.train_source`)."""
    batches, epochs = data.batches_per_epoch, data.epochs
    growth = batch_growth(config)
    if growth is not None:
        return grown_path_steps(growth, batches, epochs, config.max_steps, TrainState())
    return planned_total_steps(
        batches, config.gradient_accumulation_steps, epochs, config.max_steps, TrainState()
    )
