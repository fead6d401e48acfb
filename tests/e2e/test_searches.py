"""Hyperparameter searches end to end: the SDK, the API's search driver (Optuna), real trial jobs
on the Celery worker and torchrun. Random and bayesian searches finish with every trial, a pruner
stops clearly bad trials early, cancel stops running trials, and a search survives the API being
killed mid-way with no trial run twice. (The document's bayesian search runs as written, all 50
trials, in tests/conformance/test_service_snippets.py.)"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest

import ace3
from ace3_server.searches.space import grid_point
from tests.conftest import DigitsFiles, Stack
from tests.e2e.conftest import processes_of_job, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def uploaded(client: ace3.Client, digits_files: DigitsFiles) -> dict[str, object]:
    return {
        "model": client.load_model(digits_files.model),
        "dataset": client.load_dataset(digits_files.train),
        "validation_dataset": client.load_dataset(digits_files.validation),
    }


def _check_best_is_the_best_recorded(
    result: ace3.SearchResult, direction: str = "maximize"
) -> None:
    finished = [t for t in result.trials if t.state == "succeeded"]
    assert finished, "at least one trial succeeded"
    pick = max if direction == "maximize" else min
    best_value = pick(t.value for t in finished)
    assert result.best_value == best_value
    assert result.best_trial is not None and result.best_trial.value == best_value
    assert result.best_params == result.best_trial.params


def test_a_random_search_runs_every_trial_once_and_reports_the_best(
    client: ace3.Client, uploaded: dict[str, object], tmp_path: Path
) -> None:
    config = ace3.HPConfig(
        search_space={
            "learning_rate": ace3.hp.loguniform(1e-4, 1e-2),
            "model.hidden": ace3.hp.choice([16, 64]),
        },
        algorithm="random",
        max_trials=4,
        parallel_trials=2,
        seed=1,
        base_config=ace3.TrainingConfig(epochs=2, batch_size=64),
    )
    best = ace3.hyperparameter_search(**uploaded, config=config, client=client, show_progress=False)
    result = best.result
    assert isinstance(best, dict) and dict(best) == result.best_params
    assert [t.number for t in result.trials] == [0, 1, 2, 3]
    assert result.search.state == "succeeded" and result.search.trials_created == 4
    _check_best_is_the_best_recorded(result)
    assert result.best_value >= 0.5

    for trial in result.trials:  # every trial is an ordinary job that trained its parameters
        job = client.jobs.retrieve(trial.job_id)
        assert job.state == "succeeded"
        assert job.config["learning_rate"] == pytest.approx(trial.params["learning_rate"])
        assert job.model_kwargs["hidden"] == trial.params["model.hidden"]
    assert len({t.job_id for t in result.trials}) == 4
    assert result.epochs_run == 4 * 2

    path = result.download_best_checkpoint(to=tmp_path)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == result.best_checkpoint.sha256


def _pruning_seed() -> int:
    """A grid order whose first trial is a good one, so later bad ones have something to lose to."""
    for seed in range(100):
        probe = ace3.HPConfig(search_space=_PRUNING_SPACE, algorithm="grid", seed=seed)
        if (
            grid_point(probe, 0)["learning_rate"] == 3e-3
            and grid_point(probe, 1)["learning_rate"] == 1e-6
        ):
            return seed
    raise AssertionError("no such seed")


_PRUNING_SPACE = {"learning_rate": ace3.hp.choice([3e-3, 1e-6]), "seed": ace3.hp.choice([1, 2])}


def test_successive_halving_stops_a_clearly_bad_trial_early(
    client: ace3.Client, uploaded: dict[str, object]
) -> None:
    # An epoch here is ~0.5 s, a prune decision takes a driver pass plus a worker heartbeat
    # (~2 s, more on a loaded machine): enough epochs that "early" has room to show.
    epochs = 30
    config = ace3.HPConfig(
        search_space=_PRUNING_SPACE,
        algorithm="grid",
        pruner="successive_halving",
        parallel_trials=1,
        seed=_pruning_seed(),
        base_config=ace3.TrainingConfig(epochs=epochs, batch_size=8),
    )
    result = ace3.hyperparameter_search(
        **uploaded, config=config, client=client, show_progress=False
    ).result
    assert len(result.trials) == 4
    pruned = [t for t in result.trials if t.state == "pruned"]
    assert pruned, [(t.number, t.state, t.intermediate_values) for t in result.trials]
    bad = [t for t in pruned if t.params["learning_rate"] == 1e-6]
    assert bad, "a 1e-6 learning-rate trial was pruned"
    for trial in bad:
        assert trial.epochs_run < epochs, "it stopped before its last epoch"
        assert client.jobs.retrieve(trial.job_id).state == "cancelled"
    assert result.best_params["learning_rate"] == 3e-3
    _check_best_is_the_best_recorded(result)
    assert result.search.epochs_run < len(result.trials) * epochs


def test_cancelling_a_search_stops_its_running_trials(
    client: ace3.Client, uploaded: dict[str, object]
) -> None:
    config = ace3.HPConfig(
        search_space={"learning_rate": ace3.hp.loguniform(1e-4, 1e-2)},
        algorithm="random",
        max_trials=6,
        parallel_trials=2,
        base_config=ace3.TrainingConfig(epochs=1000, batch_size=16),
    )
    handle = ace3.hyperparameter_search(**uploaded, config=config, client=client, wait=False)

    def two_trials_training() -> bool:
        trials = handle.trials()
        return len(trials) == 2 and all(client.jobs.metrics(t.job_id) for t in trials)

    wait_for(two_trials_training, 120, "two trials to train")
    handle.cancel()
    with pytest.raises(ace3.SearchCancelledError):
        handle.wait(timeout=90)
    trials = handle.trials()
    assert len(trials) == 2, "no trial is started after the cancel"
    assert {t.state for t in trials} == {"cancelled"}
    for trial in trials:
        assert client.jobs.retrieve(trial.job_id).state == "cancelled"
        wait_for(
            lambda job_id=trial.job_id: not processes_of_job(job_id),
            15,
            "the trial's processes to exit",
        )


def test_a_search_survives_the_api_being_killed_with_no_trial_run_twice(
    client: ace3.Client, stack: Stack, uploaded: dict[str, object]
) -> None:
    config = ace3.HPConfig(
        search_space={"learning_rate": ace3.hp.loguniform(1e-3, 1e-2)},
        algorithm="bayesian",
        max_trials=5,
        parallel_trials=2,
        base_config=ace3.TrainingConfig(epochs=3, batch_size=64),
    )
    handle = ace3.hyperparameter_search(**uploaded, config=config, client=client, wait=False)
    wait_for(lambda: len(handle.trials()) >= 2, 60, "the first trials")

    stack.kill_api()  # SIGKILL mid-search: trial jobs keep training on the worker
    time.sleep(3)
    stack.start_api()

    result = handle.wait(timeout=240)
    numbers = [t.number for t in result.trials]
    assert numbers == list(range(5)), "each trial number exists once"
    assert len({t.job_id for t in result.trials}) == 5
    search_jobs = [
        job
        for job in client.jobs.list(limit=200)
        if job.name and job.name.startswith(f"search {handle.id[:8]}")
    ]
    assert len(search_jobs) == 5, "no trial job was created twice"
    assert result.search.state == "succeeded"
    _check_best_is_the_best_recorded(result)
