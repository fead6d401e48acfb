"""The best checkpoint by a monitored metric (``keep_best_checkpoint``): measured when a
checkpoint is written, remembered across resumes, never pruned.

The value that judges a checkpoint is the monitored metric *at the checkpoint's step*: a
validation metric (``val_*``) from the validation that ran at that step (after an epoch), or,
for a checkpoint written between validations, from a validation run for it now (reported as a
metrics event at that step); ``train_loss`` is the mean training loss since the last report
(the last reported value right after a report). The best so far (its step and value) travels
in the checkpoint's train state (``carry["best_checkpoint"]``), so a resumed run goes on
comparing against it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ace3.errors import UnsupportedFeatureError

if TYPE_CHECKING:
    from ace3.config import TrainingConfig
    from ace3.runtime.loop.view import LoopView

CARRY_KEY = "best_checkpoint"


def refuse_unmeasurable_monitor(config: TrainingConfig, has_validation: bool) -> None:
    """Refuse a validation monitor in a job without a validation set (before the first step)."""
    monitor = config.checkpoint_monitor
    if config.keep_best_checkpoint and monitor.startswith("val_") and not has_validation:
        raise UnsupportedFeatureError(
            f"checkpoint_monitor={monitor!r}: this job has no validation set to measure it (give "
            "a validation dataset or validation_split, or monitor 'train_loss')",
            [{"field": "checkpoint_monitor", "reason": "no validation set"}],
        )


class BestCheckpoint:
    """The best checkpoint so far by ``monitor`` (lower is better with ``mode="min"``)."""

    def __init__(self, monitor: str, mode: str, carry: dict[str, list[float]]) -> None:
        self.monitor, self.mode = monitor, mode
        saved = carry.get(CARRY_KEY) or []
        self.step: int | None = int(saved[0]) if len(saved) == 2 else None
        self.value: float | None = float(saved[1]) if len(saved) == 2 else None

    def improves(self, value: float | None) -> bool:
        if value is None or not math.isfinite(value):
            return False
        if self.value is None:
            return True
        return value < self.value if self.mode == "min" else value > self.value

    def update(self, step: int, value: float | None) -> bool:
        """Take the checkpoint of ``step`` if ``value`` beats the best; True when it did."""
        if not self.improves(value):
            return False
        assert value is not None
        self.step, self.value = step, value
        return True

    def carry(self) -> list[float] | None:
        return None if self.step is None or self.value is None else [self.step, self.value]

    def measure(self, loop: LoopView) -> float | None:
        """The monitored value at the current step (every rank calls this: it may validate)."""
        state = loop.state
        if self.monitor == "train_loss":
            loss_sum, steps = (state.carry.get("interval") or [0.0, 0.0])[:2]
            return loss_sum / steps if steps else state.last_metrics.get("train_loss")
        values = loop.validation_at_step()
        if self.monitor not in values:
            raise UnsupportedFeatureError(
                f"checkpoint_monitor={self.monitor!r}: the validation does not produce it (it "
                f"gives {', '.join(sorted(values)) or 'nothing'}); monitor one of those",
                [{"field": "checkpoint_monitor", "reason": "not a metric of this job"}],
            )
        return values[self.monitor]
