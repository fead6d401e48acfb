"""Loggers: where a run's metrics go besides the service (files, TensorBoard, W&B).

A logger is a client-side object; the same object serves an in-process run and a remote job::

    logger = ace3.TrainingLogger(log_dir="./logs", log_interval=100)
    trainer = ace3.Trainer(logger=logger)          # or logger=[logger, tensorboard, ...]

Every logger implements :class:`Logger`; the SDK trainer uses it like this:

1. ``training_fields()`` -> the :class:`~ace3.TrainingConfig` fields it sets
   (``log_interval``, ``save_interval``, ``tensorboard``), merged into the job's config.
2. In-process runs: ``engine_hooks(local=True)`` -> engine hooks to add to the run (one that
   hands every metrics event to :meth:`Logger.log_metrics`). Remote jobs: nothing runs in the
   job on the logger's behalf except what its training fields ask for.
3. Remote jobs: ``artifact_dirs()`` -> ``{artifact prefix: local directory}``: files the job
   writes under ``artifact://<prefix>/`` are copied there while it runs (TensorBoard event
   files); ``checkpoint_dir()`` -> where the job's checkpoints are copied (None: nowhere).
4. ``start(info)`` once before training (``info``: ``job_id`` (None in process), ``config``
   (the job's config as a JSON dict), ``where`` (``"local"`` or ``"remote"``));
   ``log_metrics(step, epoch, values)`` for every metrics event (in process: from the engine;
   remote: the SDK, on this machine, as the job's metrics arrive); ``finish(status)`` once at
   the end (``"succeeded"``, ``"failed"`` or ``"cancelled"``).

No torch import here: the engine-side pieces live in :mod:`ace3.runtime.logger_hooks` and
:mod:`ace3.runtime.tensorboard_hook`.
"""

from __future__ import annotations

import configparser
import importlib
import json
import math
import netrc
import os
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlparse

from ace3.config.specs import TensorBoardSpec
from ace3.errors import ACE3Error

__all__ = [
    "Logger",
    "LoggerArgumentError",
    "LoggerUnavailableError",
    "TensorBoardLogger",
    "TrainingLogger",
    "WandBLogger",
]


class LoggerArgumentError(ValueError, ACE3Error):
    """A logger argument is invalid; the message names it and the fix."""


class LoggerUnavailableError(ACE3Error):
    """A logger cannot work here: its package is missing or it is not configured. The message
    says what to install or set."""


def _path(owner: str, argument: str, value: Any) -> Path:
    if isinstance(value, str | os.PathLike) and os.fspath(value).strip():
        return Path(os.fspath(value)).expanduser()
    raise LoggerArgumentError(f"{owner}({argument}=...): expected a directory path, got {value!r}")


def _positive_int(owner: str, argument: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LoggerArgumentError(
            f"{owner}({argument}=...): expected an integer >= 1 (optimizer steps), got {value!r}"
        )
    return value


def _flag(owner: str, argument: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise LoggerArgumentError(f"{owner}({argument}=...): expected True or False, got {value!r}")
    return value


def _optional_str(owner: str, argument: str, value: Any) -> str | None:
    if value is None or (isinstance(value, str) and value.strip()):
        return value
    raise LoggerArgumentError(
        f"{owner}({argument}=...): expected a non-empty string, got {value!r}"
    )


def _json_number(value: float) -> float | None:
    return value if math.isfinite(value) else None


class Logger:
    """Base class of ACE3 loggers: every method is a no-op (see the module docstring)."""

    def training_fields(self) -> dict[str, Any]:
        """The TrainingConfig fields this logger sets."""
        return {}

    def engine_hooks(self, local: bool) -> list[Any]:
        """Engine hooks (``ace3.runtime.hooks.TrainingHook``) for an in-process run
        (``local=True``); a remote job gets none."""
        return []

    def artifact_dirs(self) -> dict[str, str]:
        """``{artifact prefix: local directory}`` to fill while a remote job runs."""
        return {}

    def checkpoint_dir(self) -> str | None:
        """Where the run's checkpoints should be copied (None: this logger wants none)."""
        return None

    def start(self, info: Mapping[str, Any]) -> None:
        """Once, before training starts."""

    def log_metrics(self, step: int, epoch: int, values: Mapping[str, float]) -> None:
        """One metrics event of the run."""

    def finish(self, status: str) -> None:
        """Once, after training ended (``succeeded``, ``failed`` or ``cancelled``)."""


# -- TrainingLogger -----------------------------------------------------------------------------


class TrainingLogger(Logger):
    """Metrics to ``log_dir/metrics.jsonl`` (one JSON line per metrics event) and the console
    (with ``verbose``: a line per event for a remote job; in process, where the engine prints
    the metrics itself, a line with the custom metrics only).

    ``log_interval``: optimizer steps between training-metric events. ``save_checkpoints``:
    save a checkpoint every ``checkpoint_interval`` steps into ``log_dir/checkpoints`` (for a
    remote job, the SDK copies them there as the job stores them).

    :meth:`add_metric` adds a custom metric: ``fn()`` is called at every metrics event in the
    process that defined it (your process: for a remote job, on your machine when the event
    arrives, not inside the job) and its value is written with the event's metrics. A failing
    or non-numeric ``fn`` gives a warning naming the metric, and the event is written without
    it.
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str] = "./logs",
        log_interval: int = 100,
        save_checkpoints: bool = False,
        checkpoint_interval: int = 1000,
        verbose: bool = True,
    ) -> None:
        owner = "TrainingLogger"
        self.log_dir = _path(owner, "log_dir", log_dir)
        self.log_interval = _positive_int(owner, "log_interval", log_interval)
        self.save_checkpoints = _flag(owner, "save_checkpoints", save_checkpoints)
        self.checkpoint_interval = _positive_int(owner, "checkpoint_interval", checkpoint_interval)
        self.verbose = _flag(owner, "verbose", verbose)
        self.custom_metrics: dict[str, Callable[[], Any]] = {}
        self._file: IO[str] | None = None
        self._job_id: str | None = None
        self._where: str | None = None
        self._failed: set[str] = set()
        self.events_written = 0

    @property
    def metrics_path(self) -> Path:
        return self.log_dir / "metrics.jsonl"

    def add_metric(self, name: str, fn: Callable[[], Any]) -> None:
        """Log ``fn()`` as ``name`` at every metrics event (a name added again is replaced)."""
        if not isinstance(name, str) or not name.strip():
            raise LoggerArgumentError(
                f"TrainingLogger.add_metric(name=...): expected a non-empty string, got {name!r}"
            )
        if not callable(fn):
            raise LoggerArgumentError(
                f"TrainingLogger.add_metric({name!r}, fn=...): fn must be callable with no "
                f"arguments (e.g. lambda: compute_custom_loss()), got {fn!r}"
            )
        self.custom_metrics[name] = fn

    def training_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"log_interval": self.log_interval}
        if self.save_checkpoints:
            fields["save_interval"] = self.checkpoint_interval
        return fields

    def engine_hooks(self, local: bool) -> list[Any]:
        if not local:
            return []
        from ace3.runtime.logger_hooks import LoggerMetricsHook

        return [LoggerMetricsHook(self)]

    def checkpoint_dir(self) -> str | None:
        if not self.save_checkpoints:
            return None
        return str((self.log_dir / "checkpoints").resolve())

    def start(self, info: Mapping[str, Any]) -> None:
        self.close()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._file = self.metrics_path.open("a", encoding="utf-8")
        self._where = info.get("where")
        job_id = info.get("job_id")
        self._job_id = str(job_id) if job_id is not None else None
        self._failed = set()
        self.events_written = 0

    def _custom_values(self) -> dict[str, float]:
        values: dict[str, float] = {}
        for name, fn in self.custom_metrics.items():
            try:
                value = fn()
                if isinstance(value, bool) or not isinstance(value, int | float):
                    value = float(value)  # a 0-d tensor or a numpy scalar
                values[name] = float(value)
            except Exception as exc:
                if name not in self._failed:
                    self._failed.add(name)
                    warnings.warn(
                        f"TrainingLogger: custom metric {name!r} failed ({type(exc).__name__}: "
                        f"{exc}); it is left out of the events while it fails. The function "
                        "must return a number.",
                        RuntimeWarning,
                        stacklevel=3,
                    )
        return values

    def log_metrics(self, step: int, epoch: int, values: Mapping[str, float]) -> None:
        if self._file is None:
            self.start({})
        assert self._file is not None
        merged = {name: float(value) for name, value in values.items()}
        custom = self._custom_values()
        merged.update(custom)
        record: dict[str, Any] = {"step": int(step), "epoch": int(epoch), "time": time.time()}
        if self._job_id is not None:
            record["job_id"] = self._job_id
        record["values"] = {name: _json_number(value) for name, value in merged.items()}
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()
        self.events_written += 1
        if self.verbose:
            # An in-process run prints its metrics already: add only the custom ones there.
            shown = custom if self._where == "local" else merged
            if shown:
                text = " ".join(f"{name}={value:.5g}" for name, value in shown.items())
                print(f"[TrainingLogger] step {step} epoch {epoch} {text}", flush=True)

    def finish(self, status: str) -> None:
        if self.verbose and self._file is not None:
            print(
                f"[TrainingLogger] {status}: {self.events_written} metrics event(s) in "
                f"{self.metrics_path}",
                flush=True,
            )
        self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


# -- TensorBoardLogger --------------------------------------------------------------------------


class TensorBoardLogger(Logger):
    """TensorBoard event files in ``log_dir`` (view with ``tensorboard --logdir=<log_dir>``).

    Written by rank 0 of the run: every metric as a scalar; with ``log_graph`` the model graph
    (traced once on a training batch), with ``log_images`` a grid of input images once (from
    an ``N,C,H,W`` or ``N,H,W`` batch, or flat inputs whose feature count is a perfect square,
    shown as square grayscale images), with ``log_histograms`` the weights at every epoch end.
    In-process runs write into ``log_dir`` directly; for a remote job the job writes the files
    and the SDK copies them into ``log_dir`` as they grow. Needs ``pip install
    'ace3[tensorboard]'`` where the run executes.
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str] = "./runs",
        log_graph: bool = False,
        log_images: bool = False,
        log_histograms: bool = False,
    ) -> None:
        owner = "TensorBoardLogger"
        self.log_dir = _path(owner, "log_dir", log_dir)
        self.log_graph = _flag(owner, "log_graph", log_graph)
        self.log_images = _flag(owner, "log_images", log_images)
        self.log_histograms = _flag(owner, "log_histograms", log_histograms)

    def spec(self) -> TensorBoardSpec:
        """The engine's settings, writing into this machine's ``log_dir`` (an in-process run
        uses it as is; a remote job's SDK maps the directory to ``artifact://tensorboard``)."""
        return TensorBoardSpec(
            log_dir=str(self.log_dir.resolve()),
            log_graph=self.log_graph,
            log_images=self.log_images,
            log_histograms=self.log_histograms,
        )

    def training_fields(self) -> dict[str, Any]:
        return {"tensorboard": self.spec()}

    def artifact_dirs(self) -> dict[str, str]:
        return {"tensorboard": str(self.log_dir.resolve())}


# -- WandBLogger --------------------------------------------------------------------------------

_WANDB_NO_CREDENTIALS_MODES = ("offline", "disabled", "dryrun")
WANDB_INSTALL_HINT = "pip install 'ace3[wandb]'"


def _import_wandb() -> Any:
    try:
        return importlib.import_module("wandb")
    except ImportError as exc:
        raise LoggerUnavailableError(
            f"WandBLogger needs the wandb package, which is not installed ({exc}): run "
            f"{WANDB_INSTALL_HINT} (or pip install wandb)"
        ) from None


def _netrc_has(host: str) -> bool:
    path = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    try:
        return netrc.netrc(str(path)).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def _settings_file_has_key() -> bool:
    directory = Path(os.environ.get("WANDB_CONFIG_DIR") or Path.home() / ".config" / "wandb")
    parser = configparser.ConfigParser()
    try:
        parser.read(directory / "settings")
    except configparser.Error:
        return False
    return any(parser.has_option(section, "api_key") for section in parser.sections())


def wandb_configuration(mode: str | None = None) -> str | None:
    """How W&B would authenticate here (``mode offline``, ``WANDB_API_KEY``, ``netrc``,
    ``settings``), or None when it is not configured."""
    mode = mode or os.environ.get("WANDB_MODE")
    if mode in _WANDB_NO_CREDENTIALS_MODES:
        return f"mode {mode}"
    if os.environ.get("WANDB_API_KEY"):
        return "WANDB_API_KEY"
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname
    if host and _netrc_has(host):
        return "netrc"
    if _settings_file_has_key():
        return "settings"
    return None


class WandBLogger(Logger):
    """Log the run's metrics to Weights & Biases, from this machine.

    ``start`` calls ``wandb.init(project=..., name=..., entity=..., config=...)`` with the job's
    training config merged under your ``config`` (your keys win), plus any ``init_kwargs``
    (``tags``, ``group``, ``mode``, ``dir``, ...); every metrics event becomes
    ``wandb.log(values, step=step)``; ``finish`` ends the W&B run (marked failed unless the
    training succeeded). For a remote job the metrics are sent from your machine as they
    arrive, so the job needs no W&B credentials.

    Needs the ``wandb`` package (``pip install 'ace3[wandb]'``) and a configuration: ``wandb
    login``, ``WANDB_API_KEY``, or ``WANDB_MODE=offline`` (write locally, ``wandb sync``
    later) / ``WANDB_MODE=disabled``. Without them the constructor raises
    :class:`LoggerUnavailableError` saying what to do.
    """

    def __init__(
        self,
        project: str,
        name: str | None = None,
        config: Mapping[str, Any] | None = None,
        entity: str | None = None,
        **init_kwargs: Any,
    ) -> None:
        owner = "WandBLogger"
        if not isinstance(project, str) or not project.strip():
            raise LoggerArgumentError(
                f"{owner}(project=...): expected the W&B project name, got {project!r}"
            )
        self.project = project
        self.name = _optional_str(owner, "name", name)
        self.entity = _optional_str(owner, "entity", entity)
        if config is not None and not isinstance(config, Mapping):
            raise LoggerArgumentError(
                f"{owner}(config=...): expected a dict of run settings, got {config!r}"
            )
        self.config = dict(config or {})
        for reserved in ("project", "name", "entity", "config"):
            init_kwargs.pop(reserved, None)
        self.init_kwargs = init_kwargs
        self._wandb = _import_wandb()
        self._check_configured()
        self.run: Any = None

    def _check_configured(self) -> None:
        if wandb_configuration(self.init_kwargs.get("mode")) is None:
            raise LoggerUnavailableError(
                "WandBLogger found no Weights & Biases credentials: run `wandb login` (or set "
                "WANDB_API_KEY=<your key>) to log to W&B; or set WANDB_MODE=offline to write the "
                "run locally and upload it later with `wandb sync`; or WANDB_MODE=disabled (or "
                "WandBLogger(..., mode='disabled')) to turn W&B off"
            )

    def engine_hooks(self, local: bool) -> list[Any]:
        if not local:
            return []
        from ace3.runtime.logger_hooks import LoggerMetricsHook

        return [LoggerMetricsHook(self)]

    def start(self, info: Mapping[str, Any]) -> None:
        self._check_configured()
        config: dict[str, Any] = dict(info.get("config") or {})
        if info.get("job_id") is not None:
            config["ace3_job_id"] = info["job_id"]
        config.update(self.config)
        self.run = self._wandb.init(
            project=self.project,
            name=self.name,
            entity=self.entity,
            config=config,
            **self.init_kwargs,
        )

    def log_metrics(self, step: int, epoch: int, values: Mapping[str, float]) -> None:
        if self.run is None:
            raise LoggerUnavailableError("WandBLogger.log_metrics before start(): call start")
        self.run.log({**dict(values), "epoch": epoch}, step=int(step))

    def finish(self, status: str) -> None:
        if self.run is None:
            return
        run, self.run = self.run, None
        run.finish(exit_code=0 if status == "succeeded" else 1)
