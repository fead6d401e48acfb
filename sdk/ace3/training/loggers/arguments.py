"""The loggers' argument checks: each error names the logger and the argument."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ace3.training.loggers.base import LoggerArgumentError

__all__ = ["checked_path", "flag", "optional_str", "positive_int"]


def checked_path(owner: str, argument: str, value: Any) -> Path:
    if isinstance(value, str | os.PathLike) and os.fspath(value).strip():
        return Path(os.fspath(value)).expanduser()
    raise LoggerArgumentError(f"{owner}({argument}=...): expected a directory path, got {value!r}")


def positive_int(owner: str, argument: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LoggerArgumentError(
            f"{owner}({argument}=...): expected an integer >= 1 (optimizer steps), got {value!r}"
        )
    return value


def flag(owner: str, argument: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise LoggerArgumentError(f"{owner}({argument}=...): expected True or False, got {value!r}")
    return value


def optional_str(owner: str, argument: str, value: Any) -> str | None:
    if value is None or (isinstance(value, str) and value.strip()):
        return value
    raise LoggerArgumentError(
        f"{owner}({argument}=...): expected a non-empty string, got {value!r}"
    )
