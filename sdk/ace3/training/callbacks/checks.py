"""The built-in callbacks' argument checks: each error names the callback and the argument."""

from __future__ import annotations

import math
from typing import Any

from ace3.training.callbacks.base import CallbackError, Mode

__all__ = ["check_bool", "check_float", "check_int", "check_mode", "check_str", "where"]


def where(owner: str, argument: str) -> str:
    return f"{owner}({argument}=...)"


def check_str(owner: str, argument: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise CallbackError(f"{where(owner, argument)}: expected a non-empty string, got {value!r}")
    return value


def check_bool(owner: str, argument: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise CallbackError(f"{where(owner, argument)}: expected True or False, got {value!r}")
    return value


def check_int(owner: str, argument: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise CallbackError(
            f"{where(owner, argument)}: expected an integer >= {minimum}, got {value!r}"
        )
    return value


def check_float(owner: str, argument: str, value: Any, minimum: float) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < minimum
    ):
        raise CallbackError(
            f"{where(owner, argument)}: expected a finite number >= {minimum}, got {value!r}"
        )
    return float(value)


def check_mode(owner: str, value: Any) -> Mode:
    if value not in ("auto", "min", "max"):
        raise CallbackError(
            f"{where(owner, 'mode')}: expected 'auto', 'min' or 'max', got {value!r}"
        )
    return value
