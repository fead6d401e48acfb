"""Search spaces become Optuna distributions; grids run each combination once; a study rebuilt
from rows asks the same questions and judges epochs with the configured pruner."""

from __future__ import annotations

from itertools import product

import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from ace3 import hp
from ace3_control.models import SearchTrial, TrialState
from ace3_server.searches import study as studies
from ace3_server.searches.space import distributions, grid_point, trial_params


def _config(**overrides: object) -> hp.HPConfig:
    space = {
        "learning_rate": hp.loguniform(1e-4, 1e-1),
        "weight_decay": hp.uniform(0.0, 0.1),
        "model.hidden": hp.randint(16, 128, step=16),
        "batch_size": hp.choice([16, 32]),
        "dropout": hp.quniform(0.0, 0.5, 0.1),
        "epochs": hp.qloguniform(2, 32, 2),
    }
    return hp.HPConfig(search_space=space, **overrides)  # type: ignore[arg-type]


def _trial(
    number: int,
    state: TrialState,
    params: dict,
    value: float | None = None,
    values: dict | None = None,
    judged: int = 0,
    system_attrs: dict | None = None,
) -> SearchTrial:
    return SearchTrial(
        search_id="s",
        number=number,
        params=params,
        sampler_params=params,
        state=state,
        value=value,
        intermediate_values={str(k): v for k, v in (values or {}).items()},
        system_attrs=system_attrs or {},
        judged_epochs=judged,
        epochs_run=len(values or {}),
    )


def test_dimensions_map_to_optuna_distributions() -> None:
    dists = distributions(_config())
    assert dists["learning_rate"] == FloatDistribution(1e-4, 1e-1, log=True)
    assert dists["weight_decay"] == FloatDistribution(0.0, 0.1)
    assert dists["model.hidden"] == IntDistribution(16, 128, step=16)
    assert dists["batch_size"] == CategoricalDistribution([16, 32])
    assert dists["dropout"] == FloatDistribution(0.0, 0.5, step=0.1)
    assert dists["epochs"] == FloatDistribution(2, 32, log=True)


def test_qloguniform_values_are_rounded_to_the_step_within_bounds() -> None:
    config = _config()
    assert trial_params(config, {"epochs": 9.2})["epochs"] == 10
    assert trial_params(config, {"epochs": 2.01})["epochs"] == 2
    assert trial_params(config, {"epochs": 31.9})["epochs"] == 32


def test_grid_runs_every_combination_exactly_once_in_a_seeded_order() -> None:
    config = hp.HPConfig(
        search_space={"learning_rate": hp.choice([1e-3, 1e-2]), "model.hidden": hp.randint(1, 3)},
        algorithm="grid",
        seed=5,
    )
    points = [grid_point(config, n) for n in range(config.trial_budget)]
    assert config.trial_budget == 6
    assert sorted(tuple(p.values()) for p in points) == sorted(product([1e-3, 1e-2], [1, 2, 3]))
    assert points == [grid_point(config, n) for n in range(6)], (
        "the order is a function of the seed"
    )
    other = hp.HPConfig(search_space=config.search_space, algorithm="grid", seed=6)
    assert [grid_point(other, n) for n in range(6)] != points


def test_a_rebuilt_study_asks_the_same_next_parameters() -> None:
    config = _config(algorithm="bayesian", max_trials=12)
    history = []
    for number in range(4):
        study = studies.rebuild("s", config, history)
        asked = study.ask(distributions(config))
        history.append(_trial(number, TrialState.SUCCEEDED, asked.params, value=float(number)))
    again = studies.rebuild("s", config, history[:3]).ask(distributions(config)).params
    assert again == history[3].sampler_params


def test_successive_halving_prunes_a_clearly_worse_trial_at_its_first_rung() -> None:
    config = hp.HPConfig(
        search_space={"learning_rate": hp.choice([1e-2, 1e-6])},
        pruner="successive_halving",
        max_trials=6,
    )
    trials = []
    for number, value in enumerate([0.9, 0.92, 0.95]):
        running = _trial(number, TrialState.RUNNING, {"learning_rate": 1e-2}, values={1: value})
        verdict, running.system_attrs = studies.judge(
            studies.rebuild("s", config, [*trials, running]), number, 1, value
        )
        assert not verdict or number > 0
        running.state, running.value, running.judged_epochs = TrialState.SUCCEEDED, value, 1
        trials.append(running)
    bad = _trial(3, TrialState.RUNNING, {"learning_rate": 1e-6}, values={1: 0.1})
    verdict, attrs = studies.judge(studies.rebuild("s", config, [*trials, bad]), 3, 1, 0.1)
    assert verdict is True
    assert attrs.get("completed_rung_0") == pytest.approx(0.1)


def test_without_a_pruner_nothing_is_pruned() -> None:
    config = hp.HPConfig(search_space={"learning_rate": hp.choice([1e-2, 1e-6])})
    done = [
        _trial(n, TrialState.SUCCEEDED, {"learning_rate": 1e-2}, value=0.9, values={1: 0.9})
        for n in range(3)
    ]
    bad = _trial(3, TrialState.RUNNING, {"learning_rate": 1e-6}, values={1: 0.1})
    assert studies.judge(studies.rebuild("s", config, [*done, bad]), 3, 1, 0.1)[0] is False
