"""The logger interface (:class:`Logger`, every method a no-op) and the loggers' errors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ace3.errors import ACE3Error

__all__ = ["Logger", "LoggerArgumentError", "LoggerUnavailableError"]


class LoggerArgumentError(ValueError, ACE3Error):
    """A logger argument is invalid; the message names it and the fix."""


class LoggerUnavailableError(ACE3Error):
    """A logger cannot work here: its package is missing or it is not configured. The message
    says what to install or set."""


class Logger:
    """Base class of ACE3 loggers: every method is a no-op (see the module docstring)."""

    def training_fields(self) -> dict[str, Any]:
        """The TrainingConfig fields this logger sets."""
        return {}

    def engine_hooks(self, local: bool) -> list[Any]:
        """Engine hooks (``ace3.runtime.loop.hooks.TrainingHook``) for an in-process run
        (``local=True``); a remote job gets none."""
        return []

    def artifact_dirs(self) -> dict[str, str]:
        """``{artifact prefix: local directory}`` to fill while a remote job runs."""
        return {}

    def checkpoint_dir(self) -> str | None:
        """Where the run's checkpoints should be copied (None: this logger wants none)."""
        return None

    def start(self, info: Mapping[str, Any]) -> None:
        """Once, before training starts."""

    def log_metrics(self, step: int, epoch: int, values: Mapping[str, float]) -> None:
        """One metrics event of the run."""

    def finish(self, status: str) -> None:
        """Once, after training ended (``succeeded``, ``failed`` or ``cancelled``)."""
