"""The training position and running results that a checkpoint carries besides the weights."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TrainState:
    """Where training stands.

    ``epoch`` is the 0-based index of the epoch in progress and ``batch_in_epoch`` the number of
    per-rank micro-batches of it already consumed; both are always at an optimizer-step boundary
    when saved. Events report 1-based epochs (:meth:`display_epoch`).
    """

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    best_val_accuracy: float | None = None
    last_metrics: dict[str, float] = field(default_factory=dict)
    # Global (loss sum, steps) of the unreported log interval and of the current epoch.
    carry: dict[str, list[float]] = field(default_factory=dict)
    # The instability guard's rollbacks so far and the learning-rate factor they left (every
    # optimizer step runs at the schedule's rate times ``lr_scale``).
    lr_scale: float = 1.0
    rollbacks: int = 0
    # This rank's position in a streamed dataset, as read from the checkpoint the run resumed
    # (or rolled back) from, until the loop has loaded it (checkpoints keep every replica's:
    # ace3.runtime.checkpoint.plain.RankStates); None for an indexed dataset.
    data_position: Any = None
    # Token ids trained on so far by every data replica together, counted once per replica
    # (the summary's ``trained_tokens``; 0 when the inputs are not token ids).
    trained_tokens: int = 0

    def display_epoch(self) -> int:
        """The 1-based epoch the last step belongs to (the last finished one at a boundary)."""
        if self.batch_in_epoch > 0 or self.epoch == 0:
            return self.epoch + 1
        return self.epoch

    def record(self, values: dict[str, float]) -> None:
        self.last_metrics.update(values)
        accuracy = values.get("val_accuracy")
        if accuracy is not None and (
            self.best_val_accuracy is None or accuracy > self.best_val_accuracy
        ):
            self.best_val_accuracy = accuracy

    def to_checkpoint(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "best_val_accuracy": self.best_val_accuracy,
            "last_metrics": dict(self.last_metrics),
            "carry": {key: list(value) for key, value in self.carry.items()},
            "lr_scale": self.lr_scale,
            "rollbacks": self.rollbacks,
            "trained_tokens": self.trained_tokens,
        }

    @classmethod
    def from_checkpoint(cls, state: dict[str, Any]) -> TrainState:
        return cls(
            step=int(state["step"]),
            epoch=int(state.get("epoch", 0)),
            batch_in_epoch=int(state.get("batch_in_epoch", 0)),
            best_val_accuracy=state.get("best_val_accuracy"),
            last_metrics={str(k): float(v) for k, v in dict(state.get("last_metrics", {})).items()},
            carry={str(k): [float(x) for x in v] for k, v in dict(state.get("carry", {})).items()},
            lr_scale=float(state.get("lr_scale", 1.0)),
            rollbacks=int(state.get("rollbacks", 0)),
            trained_tokens=int(state.get("trained_tokens", 0)),
        )
