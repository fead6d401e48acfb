"""Hyperparameter search spaces and :class:`HPConfig`: the wire contract of a search.

Each ``ace3.hp`` function returns a small pydantic model that says what to sample; the service
maps it onto Optuna's distributions. Bounds are checked here, so a bad space fails when it is
written, not minutes into a search::

    search_space = {
        "learning_rate": ace3.hp.loguniform(1e-5, 1e-2),
        "batch_size": ace3.hp.choice([16, 32, 64, 128]),
        "weight_decay": ace3.hp.uniform(0.0, 0.1),
        "model.hidden": ace3.hp.randint(32, 256),      # a keyword argument of the model factory
    }

Keys are TrainingConfig fields, or ``model.<name>`` for keyword arguments of the model factory.
No torch (and no Optuna) here.
"""

from __future__ import annotations

import itertools
import math
import sys
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ace3.config import TrainingConfig

MODEL_KWARG_PREFIX = "model."
Scalar = bool | int | float | str | None


class _Dimension(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _is_finite(value: float) -> bool:
    """Whether ``value`` is a finite float, or an integer a float can hold."""
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond the float range
        return False


def _check_bounds(low: float, high: float, *, log: bool) -> None:
    if not (_is_finite(low) and _is_finite(high)):
        raise ValueError(
            f"low and high must be finite numbers within +-{sys.float_info.max:.1e}, got "
            f"low={_short(low)}, high={_short(high)}"
        )
    if low >= high:
        raise ValueError(f"low ({low}) must be smaller than high ({high})")
    if log and low <= 0:
        raise ValueError(f"a log-scale range needs positive bounds, got low={low}")


def _check_step(low: float, high: float, step: float, *, name: str = "q") -> None:
    """``step`` must divide ``high - low`` into a finite whole number of steps; the error names
    the field (``q``, or ``step`` for randint)."""
    if not _is_finite(step):
        raise ValueError(f"the step {name} must be a finite number, got {_short(step)}")
    if step <= 0:
        raise ValueError(f"the step {name} must be positive, got {step}")
    try:
        steps = (high - low) / step
    except OverflowError:
        steps = math.inf
    if not math.isfinite(steps):
        raise ValueError(
            f"the step {name} ({step}) is too small for the range [{low}, {high}]: "
            f"(high - low) / {name} must be a finite number of steps"
        )
    if abs(steps - round(steps)) > 1e-9 * max(1.0, abs(steps)):
        raise ValueError(f"{name}: high - low ({high - low}) must be a multiple of {name} ({step})")


def _short(value: float) -> str:
    """``value`` for a message: huge integers are not printed digit by digit."""
    text = str(value)
    return text if len(text) <= 40 else f"{text[:12]}...({len(text)} digits)"


class Uniform(_Dimension):
    """A float drawn uniformly from [low, high]."""

    type: Literal["uniform"] = "uniform"
    low: float
    high: float

    @model_validator(mode="after")
    def _check(self) -> Uniform:
        _check_bounds(self.low, self.high, log=False)
        return self


class LogUniform(_Dimension):
    """A float whose logarithm is uniform on [log(low), log(high)]; low must be positive."""

    type: Literal["loguniform"] = "loguniform"
    low: float
    high: float

    @model_validator(mode="after")
    def _check(self) -> LogUniform:
        _check_bounds(self.low, self.high, log=True)
        return self


class QUniform(_Dimension):
    """A float from [low, high] on the grid low, low + q, ..., high."""

    type: Literal["quniform"] = "quniform"
    low: float
    high: float
    q: float

    @model_validator(mode="after")
    def _check(self) -> QUniform:
        _check_bounds(self.low, self.high, log=False)
        _check_step(self.low, self.high, self.q)
        return self


class QLogUniform(_Dimension):
    """Integers (or multiples of an integer q) from [low, high], sampled on a log scale."""

    type: Literal["qloguniform"] = "qloguniform"
    low: int
    high: int
    q: int = 1

    @model_validator(mode="after")
    def _check(self) -> QLogUniform:
        _check_bounds(self.low, self.high, log=True)
        _check_step(self.low, self.high, self.q)
        return self


class RandInt(_Dimension):
    """An integer from low to high, both included."""

    type: Literal["randint"] = "randint"
    low: int
    high: int
    step: int = 1

    @model_validator(mode="after")
    def _check(self) -> RandInt:
        _check_bounds(self.low, self.high, log=False)
        _check_step(self.low, self.high, self.step, name="step")
        return self


class Choice(_Dimension):
    """One of the given options (numbers, strings, booleans or None)."""

    type: Literal["choice"] = "choice"
    options: list[Scalar]

    @field_validator("options")
    @classmethod
    def _not_empty(cls, options: list[Scalar]) -> list[Scalar]:
        if not options:
            raise ValueError("choice() needs at least one option")
        if len({repr(option) for option in options}) != len(options):
            raise ValueError(f"choice() options must be distinct, got {options}")
        return options


Dimension = Annotated[
    Uniform | LogUniform | QUniform | QLogUniform | RandInt | Choice, Field(discriminator="type")
]


def uniform(low: float, high: float) -> Uniform:
    return Uniform(low=low, high=high)


def loguniform(low: float, high: float) -> LogUniform:
    return LogUniform(low=low, high=high)


def quniform(low: float, high: float, q: float) -> QUniform:
    return QUniform(low=low, high=high, q=q)


def qloguniform(low: int, high: int, q: int = 1) -> QLogUniform:
    return QLogUniform(low=low, high=high, q=q)


def randint(low: int, high: int, step: int = 1) -> RandInt:
    return RandInt(low=low, high=high, step=step)


def choice(options: list[Scalar] | tuple[Scalar, ...]) -> Choice:
    return Choice(options=list(options))


def grid_count(dimension: Dimension) -> int:
    """How many values a discrete dimension has, computed (never listed); continuous: error."""
    if isinstance(dimension, Choice):
        return len(dimension.options)
    if isinstance(dimension, RandInt):
        return (dimension.high - dimension.low) // dimension.step + 1
    if isinstance(dimension, QLogUniform | QUniform):
        return round((dimension.high - dimension.low) / dimension.q) + 1
    raise ValueError(
        f"a {dimension.type} dimension is continuous: grid search needs choice, randint, quniform or qloguniform"
    )


def grid_values(dimension: Dimension) -> list[Scalar]:
    """Every value of a discrete dimension (grid search); continuous ones have none."""
    if isinstance(dimension, Choice):
        return list(dimension.options)
    if isinstance(dimension, RandInt):
        return list(range(dimension.low, dimension.high + 1, dimension.step))
    if isinstance(dimension, QLogUniform):
        return list(range(dimension.low, dimension.high + 1, dimension.q))
    if isinstance(dimension, QUniform):
        count = round((dimension.high - dimension.low) / dimension.q)
        return [dimension.low + index * dimension.q for index in range(count + 1)]
    raise ValueError(
        f"a {dimension.type} dimension is continuous: grid search needs choice, randint, quniform or qloguniform"
    )


Algorithm = Literal["bayesian", "tpe", "random", "grid"]
Pruner = Literal["none", "median", "successive_halving", "hyperband"]
_TRAINING_FIELDS = frozenset(TrainingConfig.model_fields)
# Fields a trial cannot take from the search space: what they name is checked (ownership,
# uploads) once, for base_config, when the search is created; the settings objects are not
# scalars a dimension can hold.
_STORED = "it names stored weights, which are checked when the search is created"
NOT_SEARCHABLE = {
    "init_from": "a local file is uploaded once, when the search is created",
    "init_from_checkpoint_id": _STORED,
    "distillation": "a teacher and its settings are not one value",
    "lora": "LoRA's settings are not one value",
    "pruning": "pruning's settings are not one value",
    "quantization": "quantization's settings are not one value",
}


class HPConfig(BaseModel):
    """A hyperparameter search: what to vary, how to choose, what to optimise, how to stop."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    search_space: dict[str, Dimension] = Field(
        ..., description="TrainingConfig fields, or model.<kwarg> for the model factory."
    )
    algorithm: Algorithm = Field(
        "bayesian",
        description="bayesian (= tpe, Optuna's TPE), random, or grid (every combination once).",
    )
    max_trials: int | None = Field(
        None,
        ge=1,
        le=10_000,
        description="Trials to run; default 20, or the whole grid for grid search.",
    )
    objective: str = Field(
        "val_accuracy",
        min_length=1,
        max_length=200,
        description="A metric the trials report (val_accuracy, val_loss, ...).",
    )
    direction: Literal["maximize", "minimize"] = Field("maximize")
    parallel_trials: int = Field(1, ge=1, le=256, description="Trials running at once.")
    pruner: Pruner = Field(
        "none", description="Stop unpromising trials early, judged after every epoch."
    )
    pruner_min_epochs: int = Field(
        1, ge=1, description="Epochs every trial runs before it can be pruned."
    )
    reduction_factor: int = Field(
        3, ge=2, le=100, description="Successive halving / hyperband: keep 1/factor per rung."
    )
    max_failed_trials: int | None = Field(
        None,
        ge=1,
        description="The search fails once this many trials failed; default max(3, max_trials // 4).",
    )
    seed: int = Field(
        0, ge=0, le=2**32 - 1, description="Seeds the sampler: same seed, same trials."
    )
    base_config: TrainingConfig = Field(
        default_factory=TrainingConfig, description="Settings of every trial that are not searched."
    )

    @field_validator("search_space")
    @classmethod
    def _known_keys(cls, space: dict[str, Any]) -> dict[str, Any]:
        if not space:
            raise ValueError("the search space is empty: add at least one dimension")
        for key in space:
            if key.startswith(MODEL_KWARG_PREFIX):
                if not key[len(MODEL_KWARG_PREFIX) :].isidentifier():
                    raise ValueError(
                        f"{key!r}: model.<name> needs a Python identifier after 'model.'"
                    )
            elif key not in _TRAINING_FIELDS:
                raise ValueError(
                    f"{key!r} is not a TrainingConfig field; prefix keyword arguments of the model "
                    f"factory with 'model.' (e.g. 'model.{key}')"
                )
            elif key in NOT_SEARCHABLE:
                raise ValueError(
                    f"{key!r} cannot be searched: {NOT_SEARCHABLE[key]}; set it in base_config"
                )
        return space

    @model_validator(mode="after")
    def _grid_is_discrete(self) -> HPConfig:
        if self.algorithm == "grid":
            for key, dimension in self.search_space.items():
                try:
                    grid_count(dimension)
                except ValueError as exc:
                    raise ValueError(f"{key}: {exc}") from exc
        return self

    @property
    def grid_size(self) -> int:
        return math.prod(grid_count(d) for d in self.search_space.values())

    @property
    def trial_budget(self) -> int:
        if self.algorithm == "grid":
            return min(self.max_trials or self.grid_size, self.grid_size)
        return self.max_trials or 20

    @property
    def failure_budget(self) -> int:
        return self.max_failed_trials or max(3, self.trial_budget // 4)


def split_params(params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(TrainingConfig overrides, model factory keyword arguments) of one trial's parameters."""
    config = {k: v for k, v in params.items() if not k.startswith(MODEL_KWARG_PREFIX)}
    model_kwargs = {
        k[len(MODEL_KWARG_PREFIX) :]: v
        for k, v in params.items()
        if k.startswith(MODEL_KWARG_PREFIX)
    }
    return config, model_kwargs


def grid_search(param_grid: dict[str, list[Any]]) -> Any:
    """Yield every combination of ``param_grid`` as a dict (the document's manual loop)."""
    if not isinstance(param_grid, dict) or not param_grid:
        raise ValueError("param_grid must be a non-empty dict of name -> list of values")
    for name, values in param_grid.items():
        if isinstance(values, str | bytes) or not hasattr(values, "__iter__"):
            raise ValueError(f"param_grid[{name!r}] must be a list of values, got {values!r}")
        if not list(values):
            raise ValueError(f"param_grid[{name!r}] is empty")
    names = list(param_grid)
    for combination in itertools.product(*(list(param_grid[name]) for name in names)):
        yield dict(zip(names, combination, strict=True))
