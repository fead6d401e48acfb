"""Search-space dimensions (ace3.hp) as Optuna distributions, and back to trial parameters."""

from __future__ import annotations

import random
from itertools import product
from typing import Any

from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from ace3.hp import (
    Choice,
    HPConfig,
    LogUniform,
    QLogUniform,
    QUniform,
    RandInt,
    Uniform,
    grid_values,
)


def to_distribution(dimension: Any) -> BaseDistribution:
    if isinstance(dimension, Uniform):
        return FloatDistribution(dimension.low, dimension.high)
    if isinstance(dimension, LogUniform):
        return FloatDistribution(dimension.low, dimension.high, log=True)
    if isinstance(dimension, QUniform):
        return FloatDistribution(dimension.low, dimension.high, step=dimension.q)
    if isinstance(dimension, QLogUniform):
        # Optuna has no stepped log scale: sample the float on a log scale, round to q (hyperopt's way).
        return FloatDistribution(dimension.low, dimension.high, log=True)
    if isinstance(dimension, RandInt):
        return IntDistribution(dimension.low, dimension.high, step=dimension.step)
    if isinstance(dimension, Choice):
        return CategoricalDistribution(dimension.options)
    raise TypeError(f"unknown search dimension {dimension!r}")


def distributions(config: HPConfig) -> dict[str, BaseDistribution]:
    return {name: to_distribution(dimension) for name, dimension in config.search_space.items()}


def trial_params(config: HPConfig, sampled: dict[str, Any]) -> dict[str, Any]:
    """The values a trial trains with (qloguniform rounded to its step)."""
    params = dict(sampled)
    for name, dimension in config.search_space.items():
        if isinstance(dimension, QLogUniform):
            steps = round((float(sampled[name]) - dimension.low) / dimension.q)
            params[name] = min(
                dimension.high, max(dimension.low, dimension.low + steps * dimension.q)
            )
    return params


def grid_point(config: HPConfig, number: int) -> dict[str, Any]:
    """Trial ``number``'s combination: every combination exactly once, in a seeded order."""
    names = list(config.search_space)
    combinations = list(product(*(grid_values(config.search_space[name]) for name in names)))
    random.Random(config.seed).shuffle(combinations)
    return dict(zip(names, combinations[number], strict=True))
