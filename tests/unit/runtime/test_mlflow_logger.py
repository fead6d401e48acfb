"""MLflowLogger against a real local MLflow tracking store (read back with MlflowClient): the
config as params, metrics at their steps, the run's end status, the in-process hook, and the
errors for a missing package or bad arguments."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from ace3.runtime.loop.hooks import HookList
from ace3.training.loggers import LoggerArgumentError, LoggerUnavailableError, MLflowLogger
from tests.unit.runtime.test_loggers import make_run, small_model


@pytest.fixture
def tracking_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    pytest.importorskip("mlflow")
    # A file store: instant to create (a SQLite store runs MLflow's migrations first); MLflow 3
    # asks for this opt-in for it.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return (tmp_path / "mlruns").as_uri()


def read_run(tracking_uri: str, experiment: str) -> tuple[Any, Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    [run] = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return client, run


def test_a_run_holds_the_config_metrics_and_status(tracking_uri: str) -> None:
    logger = MLflowLogger(
        experiment_name="digits",
        run_name="experiment-1",
        tracking_uri=tracking_uri,
        config={"learning_rate": 1e-4, "model": {"hidden": 128}},
        tags={"team": "vision"},
    )
    logger.start(
        {"job_id": "job-7", "config": {"epochs": 3, "learning_rate": 0.1}, "where": "remote"}
    )
    logger.log_metrics(1, 1, {"train_loss": 2.0})
    logger.log_metrics(5, 2, {"train_loss": 1.0, "val_loss": 0.9})
    logger.finish("succeeded")

    client, run = read_run(tracking_uri, "digits")
    assert run.info.run_name == "experiment-1" and run.info.status == "FINISHED"
    # The user's config wins over the training config; nested keys are dotted.
    assert run.data.params == {"epochs": "3", "learning_rate": "0.0001", "model.hidden": "128"}
    assert run.data.tags["ace3_job_id"] == "job-7" and run.data.tags["team"] == "vision"
    history = client.get_metric_history(run.info.run_id, "train_loss")
    assert [(m.step, m.value) for m in history] == [(1, 2.0), (5, 1.0)]
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "val_loss")] == [
        (5, 0.9)
    ]
    assert [m.value for m in client.get_metric_history(run.info.run_id, "epoch")] == [1, 2]


def test_a_failed_or_cancelled_run_ends_so(tracking_uri: str) -> None:
    for status, expected in (("failed", "FAILED"), ("cancelled", "KILLED")):
        logger = MLflowLogger(experiment_name=status, tracking_uri=tracking_uri)
        logger.start({"job_id": None, "config": {}, "where": "local"})
        logger.finish(status)
        assert read_run(tracking_uri, status)[1].info.status == expected


def test_in_process_runs_log_rank_zeros_events_through_its_hook(
    tracking_uri: str, tmp_path: Path
) -> None:
    logger = MLflowLogger(experiment_name="local", tracking_uri=tracking_uri)
    assert logger.engine_hooks(local=False) == []
    logger.start({"job_id": None, "config": {"batch_size": 8}, "where": "local"})
    hooks = HookList(logger.engine_hooks(local=True))
    hooks.bind(make_run(tmp_path, small_model(), None, rank=0))
    hooks.on_metrics(10, 1, {"train_loss": 0.5})
    logger.finish("succeeded")
    client, run = read_run(tracking_uri, "local")
    assert [
        (m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train_loss")
    ] == [(10, 0.5)]


def test_without_the_package_it_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    with pytest.raises(LoggerUnavailableError, match=r"pip install 'ace3\[mlflow\]'"):
        MLflowLogger()


def test_bad_arguments_are_refused_naming_them(tracking_uri: str) -> None:
    with pytest.raises(LoggerArgumentError, match=r"experiment_name=\.\.\."):
        MLflowLogger(experiment_name="")
    with pytest.raises(LoggerArgumentError, match=r"config=\.\.\."):
        MLflowLogger(config=[1, 2])  # type: ignore[arg-type]
    with pytest.raises(LoggerArgumentError, match=r"tags=\.\.\."):
        MLflowLogger(tags={1: "x"})  # type: ignore[dict-item]
    with pytest.raises(LoggerUnavailableError, match="before start"):
        MLflowLogger(tracking_uri=tracking_uri).log_metrics(1, 0, {"loss": 1.0})
