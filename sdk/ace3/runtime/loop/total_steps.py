"""The optimizer steps of a whole fresh run (what schedules without a horizon use): the plan
of :func:`ace3.runtime.loop.step_counts.planned_total_steps`, or batch-size growth's path."""

from __future__ import annotations

from typing import Any

from torch.utils.data import Dataset

from ace3.config import TrainingConfig
from ace3.config.batch_growth import batch_growth
from ace3.runtime.loop.batch_growth import grown_path_steps
from ace3.runtime.loop.step_counts import planned_total_steps, replica_batches_per_epoch
from ace3.runtime.loop.train_state import TrainState


def total_optimizer_steps(
    config: TrainingConfig, train_set: Dataset[Any], data_world: int, replica_batch: int
) -> int:
    """Optimizer steps of a whole fresh run: the plan of :func:`planned_total_steps` from step
    0; with batch-size growth, the steps of its path
    (:func:`ace3.runtime.loop.batch_growth.grown_path_steps`)."""
    batches = replica_batches_per_epoch(train_set, 0, data_world, config.seed, replica_batch)
    growth = batch_growth(config)
    if growth is not None:
        return grown_path_steps(growth, batches, config.epoch_count, config.max_steps, TrainState())
    return planned_total_steps(
        batches, config.gradient_accumulation_steps, config.epoch_count, config.max_steps, TrainState()
    )
