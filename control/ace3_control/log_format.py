"""The service's own log lines as text or JSON (``ACE3_LOG_FORMAT``), for the server (uvicorn's
loggers and ours) and the worker (Celery's loggers, hooked in ``ace3_worker.celery_app``).

JSON lines carry ``timestamp`` (UTC, ISO 8601), ``level``, ``logger``, ``message``, and when
present ``request_id`` (the API request being served, ``X-Request-ID``), ``exception`` (the
formatted traceback) and whatever a caller adds through ``JsonFormatter.extra_fields``. A job's
training log stored in the database is not touched by any of this.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

request_id_var: ContextVar[str | None] = ContextVar("ace3_request_id", default=None)
"""The id of the API request the current task serves (set by the API's request id middleware)."""

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object a line."""

    def __init__(self, extra_fields: Callable[[], dict[str, Any]] | None = None) -> None:
        super().__init__()
        self.extra_fields = extra_fields

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = request_id_var.get()
        if request_id is not None:
            entry["request_id"] = request_id
        if self.extra_fields is not None:
            entry.update(self.extra_fields())
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def formatter_for(log_format: str) -> logging.Formatter:
    return JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)


def uvicorn_log_config(log_format: str, level: str) -> dict[str, Any] | None:
    """``uvicorn.run(log_config=...)``: None keeps uvicorn's own text setup; for JSON, uvicorn's
    loggers and the root logger (the service's own ``ace3_*`` loggers) write JSON lines."""
    if log_format != "json":
        return None
    handler = {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter}},
        "handlers": {"json": handler},
        "loggers": {
            "uvicorn": {"handlers": ["json"], "level": level.upper(), "propagate": False},
            "uvicorn.error": {"level": level.upper()},
            "uvicorn.access": {"handlers": ["json"], "level": "INFO", "propagate": False},
        },
        "root": {"handlers": ["json"], "level": level.upper()},
    }


def use_formatter(logger: logging.Logger, formatter: logging.Formatter) -> None:
    """Every handler of ``logger`` formats with ``formatter`` (Celery's after_setup hooks)."""
    for handler in logger.handlers:
        handler.setFormatter(formatter)
