"""What the built-ins share: watching one epoch metric (``mode``, improvement, a missing metric)
and reaching the engine's run."""

from __future__ import annotations

import math
import warnings
from typing import Any, Literal

from ace3.training.callbacks.base import Callback, CallbackError, Mode

__all__ = ["MonitorCallback", "resolve_mode"]


# Metric names that are better when larger, for mode="auto" (as in Keras, plus a few).
_HIGHER_IS_BETTER = ("acc", "auc", "f1", "precision", "recall", "iou", "score")


def resolve_mode(monitor: str, mode: Mode) -> Literal["min", "max"]:
    """``auto``: ``max`` for accuracy-like metrics (acc, auc, f1, ...), else ``min``."""
    if mode != "auto":
        return mode
    name = monitor.lower()
    return "max" if any(word in name for word in _HIGHER_IS_BETTER) else "min"


# -- shared machinery of the built-ins ----------------------------------------------------------


class MonitorCallback(Callback):
    """A callback that watches one epoch metric: improvement test and the missing-metric
    warning (given once per training, as Keras does, instead of failing the run)."""

    monitor: str
    mode: Mode

    def _reset_monitor(self) -> None:
        self._warned_missing = False

    def _improved(self, current: float, best: float | None, min_delta: float) -> bool:
        if math.isnan(current):
            return False
        if best is None:
            return True
        if resolve_mode(self.monitor, self.mode) == "min":
            return current < best - min_delta
        return current > best + min_delta

    def _current(self, logs: dict[str, float] | None) -> float | None:
        logs = logs or {}
        value = logs.get(self.monitor)
        if value is None:
            if not getattr(self, "_warned_missing", False):
                self._warned_missing = True
                available = ", ".join(sorted(logs)) or "none"
                hint = (
                    " (val_* metrics need validation: a validation dataset or validation_split)"
                    if self.monitor.startswith("val_")
                    else ""
                )
                warnings.warn(
                    f"{type(self).__name__}: the monitored metric {self.monitor!r} is not in "
                    f"the epoch logs (available: {available}); it does nothing until it "
                    f"appears. Set monitor= to one of the available names{hint}.",
                    RuntimeWarning,
                    stacklevel=2,
                )
            return None
        return float(value)

    def _run(self) -> Any:
        run = getattr(self, "_ace3_run", None)
        if run is None:
            raise CallbackError(
                f"{type(self).__name__} runs inside the ACE3 training engine: pass it to a "
                "trainer (ace3.Trainer(callbacks=[...])) instead of calling it directly"
            )
        return run
