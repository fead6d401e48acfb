"""The document's hyperparameter searches end to end, warm against cold: how long they take.

The searches of the ACE3 document that the conformance suite runs as written: "Automatic
Hyperparameter Tuning" (a Bayesian search of 50 trials over learning rate, batch size, weight
decay and dropout, one trial at a time) and "Manual Hyperparameter Search" (the 27
configurations of a grid, each ``ace3.Trainer(config).train(model, dataset)`` after the other,
from the client), on the digits MLP and scikit-learn's digits. Each runs on two ``ace3 up``
services with the test suite's stack settings (2 worker slots, 1 s heartbeat, a 0.5 s driver
tick), the same but one setting: ``ACE3_WARM_LAUNCH`` true (the warm path) and false (every
trial starts its sandbox and torchrun cold: the baseline). The services run one after the
other, each on a quiet machine; every trial's job is read back for where its time went::

    .venv/bin/python benchmarks/search_latency.py [--trials 50] [--grid 27]

Goal (issue 25): the 50-trial search at least 3 times faster warm than cold.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import ace3

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples" / "digits"))
sys.path.insert(0, str(REPO))

from data import write_digits  # noqa: E402

from benchmarks.job_latency import (  # noqa: E402
    TEST_STACK_ENV,
    cpu_ticks,
    wait_until_quiet,
    wall,
)
from benchmarks.stack import service  # noqa: E402

MODEL = REPO / "tests" / "conformance" / "assets" / "model.py"
SEARCH_ENV = {**TEST_STACK_ENV, "ACE3_SEARCH_TICK_SECONDS": "0.5"}


def cpu_busy_seconds() -> float:
    """CPU time the whole machine has spent busy since boot (all cores)."""
    idle, total = cpu_ticks()
    return (total - idle) / os.sysconf("SC_CLK_TCK")


def automatic(client: ace3.Client, train: Path, trials: int) -> tuple[float, list[str]]:
    """The document's Bayesian search, as written but for the number of trials: (seconds,
    its trials' job ids)."""
    model, dataset = client.load_model(MODEL), client.load_dataset(train)
    hp_config = ace3.HPConfig(
        search_space={
            "learning_rate": ace3.hp.loguniform(1e-5, 1e-2),
            "batch_size": ace3.hp.choice([16, 32, 64, 128]),
            "weight_decay": ace3.hp.uniform(0.0, 0.1),
            "dropout": ace3.hp.uniform(0.1, 0.5),
        },
        algorithm="bayesian",
        max_trials=trials,
        objective="val_accuracy",
        direction="maximize",
    )
    started, busy = time.monotonic(), cpu_busy_seconds()
    best = ace3.hyperparameter_search(
        model=model, dataset=dataset, config=hp_config, client=client, show_progress=False
    )
    seconds = time.monotonic() - started
    print(
        f"search: {seconds:.1f} s, the machine's CPUs busy for {cpu_busy_seconds() - busy:.1f} s "
        f"of {seconds * (os.cpu_count() or 1):.1f}",
        flush=True,
    )
    assert isinstance(best, ace3.BestParams)
    return seconds, [trial.job_id for trial in best.result.trials if trial.job_id]


def manual(client: ace3.Client, train: Path, count: int) -> tuple[float, list[str]]:
    """The document's grid search from the client, as written (the first ``count`` of its 27
    configurations): (seconds, its jobs' ids)."""
    model, dataset = client.load_model(MODEL), client.load_dataset(train)
    param_grid = {
        "learning_rate": [1e-4, 5e-4, 1e-3],
        "batch_size": [32, 64, 128],
        "weight_decay": [0.01, 0.05, 0.1],
    }
    jobs = []
    started = time.monotonic()
    for params in itertools.islice(ace3.utils.grid_search(param_grid), count):
        trainer = ace3.Trainer(ace3.TrainingConfig(**params))
        trainer.train(model, dataset, show_progress=False)
        assert trainer.last_job is not None
        jobs.append(trainer.last_job.id)
    return time.monotonic() - started, jobs


def job_seconds(client: ace3.Client, job_ids: list[str]) -> dict[str, float]:
    """Medians over the jobs: created to started, started to finished, created to finished."""
    rows = [client.jobs.retrieve(job_id) for job_id in job_ids]
    spans = {
        "queued": [wall(r.started_at) - wall(r.created_at) for r in rows],
        "running": [wall(r.finished_at) - wall(r.started_at) for r in rows],
        "whole job": [wall(r.finished_at) - wall(r.created_at) for r in rows],
    }
    return {name: statistics.median(values) for name, values in spans.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--grid", type=int, default=27)
    parser.add_argument("--paths", default="warm,cold", help="which services to run")
    args = parser.parse_args()
    paths = args.paths.split(",")
    results: dict[str, dict[str, tuple[float, dict[str, float]]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        train, _ = write_digits(Path(tmp))
        for path, warm in (("warm", "true"), ("cold", "false")):
            if path not in paths:
                continue
            env = {**SEARCH_ENV, "ACE3_WARM_LAUNCH": warm}
            with service(env) as (base_url, key), ace3.Client(api_key=key, base_url=base_url) as c:
                ace3.set_default_client(c)
                wait_until_quiet()
                seconds, jobs = automatic(c, train, args.trials)
                results.setdefault(path, {})["automatic"] = (seconds, job_seconds(c, jobs))
                wait_until_quiet()
                seconds, jobs = manual(c, train, args.grid)
                results[path]["manual"] = (seconds, job_seconds(c, jobs))
    names = {  # (what each search is, for the tables)
        "automatic": f"Automatic Hyperparameter Tuning ({args.trials} trials, Bayesian)",
        "manual": f"Manual Hyperparameter Search ({args.grid} configurations, one after another)",
    }
    if len(results) < 2:
        for path, searches in results.items():
            for search, (seconds, spans) in searches.items():
                print(f"{path} {names[search]}: {seconds:.1f} s end to end, jobs {spans}")
        return 0
    for search, title in names.items():
        (warm, warm_jobs), (cold, cold_jobs) = results["warm"][search], results["cold"][search]
        print(f"\n{title}")
        print(f"{'':<28}{'warm':>9}{'cold':>9}{'cold/warm':>11}")
        print(f"{'end to end (s)':<28}{warm:>9.1f}{cold:>9.1f}{cold / warm:>11.2f}")
        for span in warm_jobs:
            print(
                f"{'a job, ' + span + ' (median s)':<28}{warm_jobs[span]:>9.2f}"
                f"{cold_jobs[span]:>9.2f}{cold_jobs[span] / warm_jobs[span]:>11.2f}"
            )
        if search == "automatic":
            verdict = "met" if cold / warm >= 3 else "NOT met"
            print(f"goal: at least 3 times faster warm: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
