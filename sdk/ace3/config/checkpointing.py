"""Checkpoint-keeping settings of :class:`~ace3.config.training.TrainingConfig`: the best
checkpoint by a monitored metric (kept beside the newest ``max_checkpoints``, never pruned) and
asynchronous saving. Kept apart so that the training schema stays readable; ``TrainingConfig``
inherits :class:`CheckpointFields`. A ``val_*`` monitor in a job without a validation set
(``validation_split=0`` and no validation dataset: only the job's data tell) is refused by the
engine before the first step. What the engine does with them:
:mod:`ace3.runtime.checkpoint.saver`, :mod:`ace3.runtime.checkpoint.best`,
:mod:`ace3.runtime.checkpoint.background`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

# The training metric a checkpoint can be judged by besides the validation metrics (val_*).
TRAINING_MONITORS = ("train_loss",)

MonitorName = Annotated[
    str,
    StringConstraints(
        strip_whitespace=True, min_length=1, max_length=200, pattern=r"^(train_loss|val_\S+)$"
    ),
]


class CheckpointFields(BaseModel):
    """``keep_best_checkpoint`` / ``checkpoint_monitor`` / ``checkpoint_mode``: keep the best
    checkpoint by a metric; ``async_save``: write checkpoints in the background."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    keep_best_checkpoint: bool = Field(
        False,
        description="Keep the checkpoint with the best checkpoint_monitor value beside the newest "
        "max_checkpoints; it is never pruned (locally or on the service).",
    )
    checkpoint_monitor: MonitorName = Field(
        "val_loss",
        description="The metric that judges checkpoints: a validation metric (val_loss, "
        "val_accuracy, val_<name> of compute_metrics; measured at the checkpoint's step, the "
        "validation set is run when a checkpoint is written between epochs) or train_loss (the "
        "mean since the last report).",
    )
    checkpoint_mode: Literal["min", "max"] = Field(
        "min", description="'min': a lower checkpoint_monitor is better; 'max': a higher one."
    )
    async_save: bool = Field(
        False,
        description="Stage the training state in CPU memory and write the checkpoint in the "
        "background while training continues (one save in flight at most; the checkpoint is "
        "recorded once its file is complete).",
    )
