""":class:`MLflowLogger`: the run's config and metrics logged to an MLflow tracking server (or
any MLflow tracking URI) from this machine."""

from __future__ import annotations

import importlib
import time
from collections.abc import Iterator, Mapping
from typing import Any

from ace3.training.loggers.arguments import optional_str
from ace3.training.loggers.base import Logger, LoggerArgumentError, LoggerUnavailableError

__all__ = ["MLFLOW_INSTALL_HINT", "MLflowLogger"]

MLFLOW_INSTALL_HINT = "pip install 'ace3[mlflow]'"
MAX_PARAM_CHARS = 500  # every MLflow tracking server accepts this much (newer ones more)
PARAMS_PER_BATCH = 100  # MLflow's log_batch limit
DEFAULT_EXPERIMENT = "Default"
_RUN_STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}


def _import_mlflow() -> tuple[Any, Any]:
    """(``mlflow.tracking.MlflowClient``, ``mlflow.entities``)."""
    try:
        tracking = importlib.import_module("mlflow.tracking")
        entities = importlib.import_module("mlflow.entities")
    except ImportError as exc:
        raise LoggerUnavailableError(
            f"MLflowLogger needs the mlflow package, which is not installed ({exc}): run "
            f"{MLFLOW_INSTALL_HINT} (or pip install mlflow-skinny)"
        ) from None
    return tracking.MlflowClient, entities


def flat_params(values: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """Nested dicts as dotted keys, every value as MLflow stores params: a (bounded) string."""
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from flat_params(value, f"{name}.")
        else:
            yield name, str(value)[:MAX_PARAM_CHARS]


class MLflowLogger(Logger):
    """Log the run to MLflow, from this machine.

    ``start`` creates a run (in ``experiment_name``, created when missing; MLflow's
    ``Default`` experiment when None) named ``run_name``, tagged with ``tags`` and the ACE3 job
    id (``ace3_job_id``), and logs the job's training config merged under your ``config``
    (your keys win) as params (nested keys dotted); every metrics event becomes MLflow metrics
    at that step (plus ``epoch``); ``finish`` ends the run ``FINISHED``, ``FAILED`` or
    ``KILLED``. ``tracking_uri``: where MLflow writes (``http://mlflow:5000``,
    ``sqlite:///mlflow.db``, ...); None uses MLflow's own default (``MLFLOW_TRACKING_URI``).
    For a remote job all of this happens on your machine as the metrics arrive, so the job
    needs no access to your tracking server.

    Needs the ``mlflow`` package (``pip install 'ace3[mlflow]'``, which installs
    ``mlflow-skinny``); without it the constructor raises :class:`LoggerUnavailableError`.
    """

    def __init__(
        self,
        experiment_name: str | None = None,
        run_name: str | None = None,
        tracking_uri: str | None = None,
        config: Mapping[str, Any] | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> None:
        owner = "MLflowLogger"
        self.experiment_name = optional_str(owner, "experiment_name", experiment_name)
        self.run_name = optional_str(owner, "run_name", run_name)
        self.tracking_uri = optional_str(owner, "tracking_uri", tracking_uri)
        if config is not None and not isinstance(config, Mapping):
            raise LoggerArgumentError(
                f"{owner}(config=...): expected a dict of run settings, got {config!r}"
            )
        if tags is not None and not (
            isinstance(tags, Mapping) and all(isinstance(key, str) for key in tags)
        ):
            raise LoggerArgumentError(
                f"{owner}(tags=...): expected a dict of tag names to values, got {tags!r}"
            )
        self.config = dict(config or {})
        self.tags = {key: str(value) for key, value in (tags or {}).items()}
        self._client_class, self._entities = _import_mlflow()
        self.client: Any = None
        self.run_id: str | None = None

    def engine_hooks(self, local: bool) -> list[Any]:
        if not local:
            return []
        from ace3.runtime.observe.logger_hooks import LoggerMetricsHook

        return [LoggerMetricsHook(self)]

    def _experiment_id(self) -> str:
        name = self.experiment_name or DEFAULT_EXPERIMENT
        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            return str(experiment.experiment_id)
        return str(self.client.create_experiment(name))

    def start(self, info: Mapping[str, Any]) -> None:
        self.client = self._client_class(tracking_uri=self.tracking_uri)
        tags = dict(self.tags)
        if info.get("job_id") is not None:
            tags["ace3_job_id"] = str(info["job_id"])
        run = self.client.create_run(self._experiment_id(), run_name=self.run_name, tags=tags)
        self.run_id = run.info.run_id
        config: dict[str, Any] = dict(info.get("config") or {})
        config.update(self.config)
        params = [self._entities.Param(key, value) for key, value in flat_params(config)]
        for first in range(0, len(params), PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[first : first + PARAMS_PER_BATCH])

    def log_metrics(self, step: int, epoch: int, values: Mapping[str, float]) -> None:
        if self.run_id is None:
            raise LoggerUnavailableError("MLflowLogger.log_metrics before start(): call start")
        now = int(time.time() * 1000)
        metrics = [
            self._entities.Metric(name, float(value), now, int(step))
            for name, value in {**dict(values), "epoch": epoch}.items()
        ]
        self.client.log_batch(self.run_id, metrics=metrics)

    def finish(self, status: str) -> None:
        if self.run_id is None:
            return
        run_id, self.run_id = self.run_id, None
        self.client.set_terminated(run_id, status=_RUN_STATUS.get(status, "FAILED"))
