"""Checkpoint-keeping settings of :class:`~ace3.config.training.TrainingConfig`: the best
checkpoint by a monitored metric (kept beside the newest ``max_checkpoints``, never pruned) and
asynchronous saving. Kept apart so that the training schema stays readable; ``TrainingConfig``
inherits :class:`CheckpointFields`. What the engine does with them:
:mod:`ace3.runtime.checkpoint.saver`, :mod:`ace3.runtime.checkpoint.best`,
:mod:`ace3.runtime.checkpoint.background`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

if TYPE_CHECKING:
    from ace3.config.training import TrainingConfig
    from ace3.config.unsupported import ConfigProblem

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


def checkpoint_problems(config: TrainingConfig) -> list[ConfigProblem]:
    """What ``keep_best_checkpoint`` / ``async_save`` cannot run with, each with its reason
    (for :func:`ace3.config.unsupported.unsupported_settings`)."""
    from ace3.config.unsupported import ConfigProblem  # (it imports this module's users)

    problems: list[ConfigProblem] = []
    monitor = config.checkpoint_monitor
    if config.keep_best_checkpoint and monitor.startswith("val_") and config.validation_split == 0:
        problems.append(
            ConfigProblem(
                field="checkpoint_monitor",
                reason=(
                    f"checkpoint_monitor={monitor!r} with validation_split=0: the job has no "
                    "validation set to measure it; monitor 'train_loss' or keep a validation "
                    "split"
                ),
            )
        )
    return problems
