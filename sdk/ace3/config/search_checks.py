"""Checks that a search can run: settings the engine lacks, and searched values a field refuses.

Shared by the SDK (before any request) and the API (422 at creation), so no trial fails later for
a reason that was knowable up front. Standard library and pydantic only.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Annotated, Any

from pydantic import TypeAdapter
from pydantic import ValidationError as PydanticValidationError

from ace3.config import ConfigProblem, TrainingConfig, unsupported_settings
from ace3.hp import (
    MODEL_KWARG_PREFIX,
    Choice,
    Dimension,
    HPConfig,
    LogUniform,
    RandInt,
    Uniform,
    grid_count,
)


def search_space_problems(config: HPConfig) -> tuple[list[ConfigProblem], list[str]]:
    """(settings the engine does not implement, in base_config or among searched values;
    searched values a TrainingConfig field does not accept)."""
    problems = list(unsupported_settings(config.base_config))
    invalid: list[str] = []
    for key, dimension in config.search_space.items():
        if key.startswith(MODEL_KWARG_PREFIX):
            continue  # the model factory's arguments: only the model knows them
        values = _probe_values(dimension)
        problems += _unsupported_values(config.base_config, key, values)
        invalid += _invalid_values(config.base_config, key, dimension, values)
    return problems, invalid


def _probe_values(dimension: Dimension) -> list[Any]:
    """Every option of a choice; the bounds and one inner point of a range (a non-integral one
    for float ranges, so that a range over an integer field is caught). Never the whole range:
    randint(0, 2**32 - 1) is a fine space for a seed."""
    if isinstance(dimension, Uniform | LogUniform):
        low, high = dimension.low, dimension.high
        log = isinstance(dimension, LogUniform)
        for fraction in (0.5, 0.37, 0.123):
            if log:
                inner = math.exp(math.log(low) + fraction * (math.log(high) - math.log(low)))
            else:
                inner = low + fraction * (high - low)
            if not float(inner).is_integer():
                break
        return [low, high, inner]
    if isinstance(dimension, Choice):
        return list(dimension.options)
    count = grid_count(dimension)
    step = dimension.step if isinstance(dimension, RandInt) else dimension.q
    return [dimension.low, dimension.low + (count // 2) * step, dimension.high]


def _unsupported_values(base: TrainingConfig, key: str, values: list[Any]) -> list[ConfigProblem]:
    problems: dict[str, ConfigProblem] = {}
    # A searched value may make another field unsupported (num_nodes=2 with async_save and
    # ZeRO): whatever the base config alone does not raise is the searched value's doing.
    base_reasons = {problem.reason for problem in unsupported_settings(base)}
    for value in values:
        candidate = base.model_copy(update={key: value})
        for problem in unsupported_settings(candidate):
            caused = problem.field == key or problem.reason not in base_reasons
            if caused and problem.reason not in problems:
                problems[problem.reason] = ConfigProblem(
                    field=f"search_space.{key}", reason=f"search_space: {problem.reason}"
                )
    return list(problems.values())


def _invalid_values(
    base: TrainingConfig, key: str, dimension: Dimension, values: list[Any]
) -> list[str]:
    adapter = _field_adapter(key)
    for value in values:
        try:
            adapter.validate_python(value)
        except PydanticValidationError as exc:
            reason = exc.errors()[0].get("msg", "invalid")
            if isinstance(dimension, Uniform | LogUniform) and "integer" in reason:
                return [
                    f"{key}: {dimension.type} draws floats, but {key} takes integers: use "
                    "ace3.hp.randint, qloguniform or choice"
                ]
            return [f"{key}: {value!r} ({dimension.type}) is not a valid {key}: {reason}"]
        try:  # and with the rest of the config (e.g. a batch the processes cannot split)
            TrainingConfig.model_validate({**base.model_dump(), key: value})
        except PydanticValidationError as exc:
            reason = exc.errors()[0].get("msg", "invalid")
            return [f"{key}: {value!r} ({dimension.type}) does not fit base_config: {reason}"]
    return []


@cache
def _field_adapter(key: str) -> TypeAdapter[Any]:
    """Validates one TrainingConfig field on its own (its type and bounds, not the checks
    that involve other fields)."""
    info = TrainingConfig.model_fields[key]
    annotation: Any = info.annotation
    if not info.metadata:
        return TypeAdapter(annotation)
    return TypeAdapter(Annotated[annotation, *info.metadata])
