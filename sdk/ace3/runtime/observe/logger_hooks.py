"""Engine hooks that serve client-side loggers in an in-process run.

:class:`LoggerMetricsHook` hands every metrics event of rank 0 to a logger's
``log_metrics`` (the same call the SDK makes for a remote job's events). A logger that fails
gives a warning and the run goes on: losing a log line must not lose the training.
"""

from __future__ import annotations

import warnings
from typing import Any

from ace3.runtime.loop.hooks import TrainingHook


class LoggerMetricsHook(TrainingHook):
    """``on_metrics`` -> ``logger.log_metrics(step, epoch, values)`` on rank 0."""

    def __init__(self, logger: Any) -> None:
        self.logger = logger
        self.failures = 0

    def on_metrics(self, step: int, epoch: int, values: dict[str, float]) -> None:
        if not self.run.is_main:
            return
        try:
            self.logger.log_metrics(step, epoch, dict(values))
        except Exception as exc:
            self.failures += 1
            if self.failures == 1:
                warnings.warn(
                    f"{type(self.logger).__name__}.log_metrics failed at step {step} "
                    f"({type(exc).__name__}: {exc}); training goes on, and further failures "
                    "of this logger are not reported",
                    RuntimeWarning,
                    stacklevel=2,
                )
