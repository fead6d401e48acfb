"""What the training loop reports at its end (the summary's figures) and when a non-finite
training loss stops it."""

from __future__ import annotations

from typing import Any

from ace3.errors import NonFiniteLossError
from ace3.runtime.loop.metric_window import NonFiniteLoss
from ace3.runtime.loop.train_state import TrainState
from ace3.runtime.observe.reporting import EventWriter

# The training metrics the summary repeats (their last reported values).
SUMMARY_TRAINING_METRICS = ("train_loss", "kd_loss", "feature_loss", "task_loss", "attention_loss")


def final_metrics(
    state: TrainState,
    scaler: Any,
    split: int,
    memory: dict[str, Any] | None,
    extras: dict[str, Any] | None,
) -> dict[str, Any]:
    """The summary: the last training and validation metrics, the position, the memory figures
    (``memory``), the micro-batch split and the loss scaler's figures, then ``extras`` (the
    extensions')."""
    final: dict[str, Any] = {
        key: value
        for key, value in state.last_metrics.items()
        if key in SUMMARY_TRAINING_METRICS or key.startswith("val_")
    }
    if state.best_val_accuracy is not None:
        final["best_val_accuracy"] = state.best_val_accuracy
    final["steps"] = state.step
    final["epochs"] = state.display_epoch()
    if state.trained_tokens > 0:
        final["trained_tokens"] = state.trained_tokens
    if memory is not None:
        final.update(memory)
    if split > 1:
        final["micro_batch_split"] = split
    if scaler.is_enabled():
        final["skipped_steps"] = scaler.skipped_steps
        final["loss_scale"] = float(scaler.get_scale())
    final.update(extras or {})
    return final


def nonfinite_loss_error(
    found: NonFiniteLoss, state: TrainState, events: EventWriter
) -> NonFiniteLossError:
    """The first non-finite training loss, recorded; the error that stops every rank."""
    error = NonFiniteLossError(found.step, state.step, found.value)
    events.nonfinite_loss(found.step, state.step, state.display_epoch(), "train_loss", found.value)
    return error
