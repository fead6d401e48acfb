"""The engine's log: ``logging`` with the rank in every record, instead of bare prints.

Two channels: :data:`ENGINE` (``ace3.runtime``: build notes, checkpoints, techniques,
warnings) and :data:`METRICS` (``ace3.runtime.metrics``: the metric echo and progress lines of
the loop, ``step N epoch E train_loss=...``, the validation lines and ``done: ...``), so a
user's logging configuration can tell them apart or silence one. Every record carries
``record.rank`` (:class:`RankFilter`: the process's ``RANK``, or what :func:`set_rank` set).

The lines reach the job log exactly as the prints did: the engine's handler writes the bare
message to the *current* ``sys.stdout`` (or ``sys.stderr`` for records logged with
:data:`TO_STDERR`), so under torchrun they pass through the ``[rank R] `` prefix of
:mod:`ace3.runtime.process.log_prefix` that the worker parses, and in-process runs print them
as before (pytest's capture included). The engine's loggers do not propagate to the root
logger (a user's root handler would print each line twice); the user's own prints are not
touched at all.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

ENGINE = logging.getLogger("ace3.runtime")
METRICS = logging.getLogger("ace3.runtime.metrics")
TO_STDERR: dict[str, Any] = {"stream": "stderr"}  # extra=TO_STDERR: the line goes to stderr

_rank: int | None = None


def set_rank(rank: int) -> None:
    """The rank every later record carries (the default: the ``RANK`` variable, else 0)."""
    global _rank
    _rank = rank


def current_rank() -> int:
    if _rank is not None:
        return _rank
    try:
        return int(os.environ.get("RANK", "0") or 0)
    except ValueError:
        return 0


class RankFilter(logging.Filter):
    """Puts ``rank`` into every record that does not carry one."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "rank"):
            record.rank = current_rank()
        return True


class StdStreamHandler(logging.Handler):
    """Writes each record's formatted text and a newline to the process's current stdout (or
    stderr for a record with ``stream="stderr"``), flushed at once, as ``print(..., flush=True)``
    did."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            name = "stderr" if getattr(record, "stream", "stdout") == "stderr" else "stdout"
            stream = getattr(sys, name)
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:
            self.handleError(record)


def keep_engine_log() -> None:
    """Undo what a user's logging setup did to the engine's own channels: the model file is
    imported after these loggers exist, and ``logging.config.dictConfig``/``fileConfig``
    disable every existing logger by default (``disable_existing_loggers=True``), which would
    take the engine's ``ready``/step/``done`` lines and its exit reasons out of the job log.
    Called once the user's code is imported and before the exit reasons are written; a user
    may still raise a channel's level to quiet it."""
    for logger in (ENGINE, METRICS):
        logger.disabled = False
    _install()


def _install() -> None:
    if any(isinstance(handler, StdStreamHandler) for handler in ENGINE.handlers):
        return
    handler = StdStreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.addFilter(RankFilter())
    ENGINE.addHandler(handler)
    for logger in (ENGINE, METRICS):  # (a logger's filters see only its own records)
        logger.addFilter(RankFilter())
    ENGINE.setLevel(logging.INFO)
    ENGINE.propagate = False


_install()
