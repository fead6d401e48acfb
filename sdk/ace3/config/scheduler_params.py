"""The keyword arguments each learning-rate schedule accepts: names, types and ranges.

One table serves the wire schema (``ace3.config.specs.SchedulerSpec``, so the API refuses a bad
schedule with a 422 when the job is submitted rather than when it starts) and the Python
classes in ``ace3.training.schedulers`` (which check their arguments with the same function). No torch
import here.

``cosine.T_max``, ``warmup_cosine.total_steps`` and ``polynomial.total_steps`` are optional in a
spec: the engine then uses the job's total number of optimizer steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["SCHEDULER_PARAMS", "check_scheduler_params"]

Check = Callable[[str, Any], Any]


def _integer(minimum: int) -> Check:
    def check(key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"'{key}' must be an integer >= {minimum}, got {value!r}")
        return value

    return check


def _number(
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> Check:
    bounds = []
    if low is not None:
        bounds.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        bounds.append(f"{'<' if high_open else '<='} {high:g}")
    wanted = "a number" + (" " + " and ".join(bounds) if bounds else "")

    def check(key: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"'{key}' must be {wanted}, got {value!r}")
        number = float(value)
        too_low = low is not None and (number <= low if low_open else number < low)
        too_high = high is not None and (number >= high if high_open else number > high)
        if not math.isfinite(number) or too_low or too_high:
            raise ValueError(f"'{key}' must be {wanted}, got {value!r}")
        return number

    return check


def _optional(inner: Check) -> Check:
    def check(key: str, value: Any) -> Any:
        return None if value is None else inner(key, value)

    return check


def _choice(*options: str) -> Check:
    def check(key: str, value: Any) -> str:
        if not isinstance(value, str) or value not in options:
            allowed = ", ".join(map(repr, options))
            raise ValueError(f"'{key}' must be one of {allowed}, got {value!r}")
        return value

    return check


def _metric_name(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"'{key}' must be a metric name such as 'val_loss', got {value!r}")
    return value


#: Per schedule: each keyword argument -> (its check, whether a spec must give it).
SCHEDULER_PARAMS: dict[str, dict[str, tuple[Check, bool]]] = {
    "cosine": {"T_max": (_integer(1), False), "eta_min": (_number(0.0), False)},
    "warmup_cosine": {
        "warmup_steps": (_integer(0), True),
        "total_steps": (_integer(1), False),
        "max_lr": (_optional(_number(0.0, low_open=True)), False),
        "min_lr": (_number(0.0), False),
    },
    "polynomial": {
        "warmup_steps": (_integer(0), True),
        "total_steps": (_integer(1), False),
        "power": (_number(0.0, 100.0, low_open=True), False),
        "min_lr": (_number(0.0), False),
    },
    "warmup": {"warmup_steps": (_integer(1), True)},
    "step": {"step_size": (_integer(1), True), "gamma": (_number(0.0, low_open=True), False)},
    "linear": {
        "start_factor": (_number(0.0, 1.0, low_open=True), False),
        "end_factor": (_number(0.0, 1.0), False),
        "total_iters": (_integer(1), False),
    },
    "exponential": {"gamma": (_number(0.0, low_open=True), True)},
    "plateau": {
        "mode": (_choice("min", "max"), False),
        "factor": (_number(0.0, 1.0, low_open=True, high_open=True), False),
        "patience": (_integer(0), False),
        "threshold": (_number(0.0), False),
        "threshold_mode": (_choice("rel", "abs"), False),
        "cooldown": (_integer(0), False),
        "min_lr": (_number(0.0), False),
        "monitor": (_metric_name, False),
    },
}


def check_scheduler_params(name: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """Check ``params`` for the schedule ``name`` and return them normalised (an integer given
    for a float parameter becomes a float).

    Raises ``ValueError`` naming the schedule, the parameter and what it accepts.
    """
    if name not in SCHEDULER_PARAMS:
        raise ValueError(
            f"unknown lr_scheduler {name!r}; choose one of {', '.join(SCHEDULER_PARAMS)}"
        )
    if not isinstance(params, Mapping):
        raise ValueError(f"lr_scheduler {name!r}: params must be a mapping, got {params!r}")
    table = SCHEDULER_PARAMS[name]
    unknown = sorted(str(key) for key in params if key not in table)
    if unknown:
        raise ValueError(
            f"lr_scheduler {name!r} has no parameter {', '.join(map(repr, unknown))}; "
            f"its parameters are {', '.join(table)}"
        )
    missing = [key for key, (_, required) in table.items() if required and key not in params]
    if missing:
        raise ValueError(f"lr_scheduler {name!r} needs parameter {', '.join(map(repr, missing))}")
    checked = {}
    for key, value in params.items():
        try:
            checked[key] = table[key][0](key, value)
        except ValueError as exc:
            raise ValueError(f"lr_scheduler {name!r}: {exc}") from None
    _check_together(name, checked)
    return checked


def _check_together(name: str, params: dict[str, Any]) -> None:
    """Constraints between parameters (each one alone already passed)."""
    if name not in ("warmup_cosine", "polynomial"):
        return
    warmup, total = params.get("warmup_steps"), params.get("total_steps")
    if warmup is not None and total is not None and warmup > total:
        raise ValueError(
            f"lr_scheduler {name!r}: 'warmup_steps' ({warmup}) must be <= 'total_steps' ({total})"
        )
    max_lr, min_lr = params.get("max_lr"), params.get("min_lr")
    if max_lr is not None and min_lr is not None and min_lr > max_lr:
        raise ValueError(
            f"lr_scheduler 'warmup_cosine': 'min_lr' ({min_lr:g}) must be <= 'max_lr' ({max_lr:g})"
        )
