"""An Optuna study rebuilt from our trial rows, with the configured sampler and pruner.

The database is the only state: every driver pass rebuilds the study (finished trials with
their values, running ones with their intermediate values and the pruner's bookkeeping), asks
it for new parameters or asks its pruner about running trials, and writes the results back.
A restarted API therefore continues exactly where the last one stopped.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.pruners import (
    BasePruner,
    HyperbandPruner,
    MedianPruner,
    NopPruner,
    SuccessiveHalvingPruner,
)
from optuna.samplers import BaseSampler, RandomSampler, TPESampler
from optuna.trial import FrozenTrial, create_trial
from optuna.trial import TrialState as OptunaState

from ace3.hp import HPConfig
from ace3_control.models import SearchTrial, TrialState
from ace3_server.searches.space import distributions

optuna.logging.set_verbosity(logging.WARNING)

_OPTUNA_STATES = {
    TrialState.RUNNING: OptunaState.RUNNING,
    TrialState.SUCCEEDED: OptunaState.COMPLETE,
    TrialState.PRUNED: OptunaState.PRUNED,
    TrialState.FAILED: OptunaState.FAIL,
    TrialState.CANCELLED: OptunaState.FAIL,
}


def make_sampler(config: HPConfig, trials_so_far: int) -> BaseSampler:
    # Seeded by the history's length: the same search asks the same questions, even after a restart.
    seed = config.seed + trials_so_far
    if config.algorithm in ("bayesian", "tpe"):
        return TPESampler(seed=seed, n_startup_trials=max(2, min(10, config.trial_budget // 3)))
    return RandomSampler(seed=seed)


def make_pruner(config: HPConfig) -> BasePruner:
    first = config.pruner_min_epochs
    if config.pruner == "median":
        startup = max(1, min(5, config.trial_budget // 5))
        return MedianPruner(n_startup_trials=startup, n_warmup_steps=first - 1)
    if config.pruner == "successive_halving":
        return SuccessiveHalvingPruner(min_resource=first, reduction_factor=config.reduction_factor)
    if config.pruner == "hyperband":
        return HyperbandPruner(
            min_resource=first,
            max_resource=max(first, config.base_config.epoch_count),
            reduction_factor=config.reduction_factor,
        )
    return NopPruner()


def intermediate(trial: SearchTrial) -> dict[int, float]:
    return {int(epoch): float(value) for epoch, value in trial.intermediate_values.items()}


def rebuild(search_id: str, config: HPConfig, trials: Sequence[SearchTrial]) -> optuna.Study:
    """The study as our rows describe it; trials are added in number order (Optuna numbers match).

    Running trials carry only the epochs the pruner has already judged (``judged_epochs``), so
    the next epochs can be reported and judged one by one, in order, by :func:`judge`.
    """
    study = optuna.create_study(
        study_name=search_id,
        direction=config.direction,
        sampler=make_sampler(config, len(trials)),
        pruner=make_pruner(config),
    )
    dists = distributions(config)
    for trial in sorted(trials, key=lambda t: t.number):
        state = _OPTUNA_STATES[TrialState(trial.state)]
        values = intermediate(trial)
        if state == OptunaState.RUNNING:
            values = dict(sorted(values.items())[: trial.judged_epochs])
        study.add_trial(
            create_trial(
                state=state,
                value=trial.value if state == OptunaState.COMPLETE else None,
                params=trial.sampler_params,
                distributions=dists,
                intermediate_values=values,
                system_attrs=dict(trial.system_attrs),
            )
        )
    return study


def judge(
    study: optuna.Study, number: int, epoch: int, value: float
) -> tuple[bool, dict[str, Any]]:
    """Report a running trial's objective after ``epoch`` and ask the pruner; return its verdict
    and the pruner's bookkeeping for that trial (successive halving keeps its rungs there)."""
    frozen: FrozenTrial = study.trials[number]
    trial = optuna.trial.Trial(study, frozen._trial_id)
    trial.report(value, step=epoch)
    verdict = trial.should_prune()
    return verdict, dict(study.trials[number].system_attrs)
