""":class:`WandBLogger`: the run's metrics sent to Weights & Biases from this machine, and how W&B
would authenticate here."""

from __future__ import annotations

import configparser
import importlib
import netrc
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ace3.training.loggers.arguments import optional_str
from ace3.training.loggers.base import Logger, LoggerArgumentError, LoggerUnavailableError

__all__ = ["WANDB_INSTALL_HINT", "WandBLogger", "wandb_configuration"]


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
        self.name = optional_str(owner, "name", name)
        self.entity = optional_str(owner, "entity", entity)
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
        from ace3.runtime.observe.logger_hooks import LoggerMetricsHook

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
