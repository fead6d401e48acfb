""":class:`TrainingLogger`: the run's metrics as JSON lines in a directory, plus checkpoints and
custom metrics."""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from ace3.training.loggers.arguments import checked_path, flag, positive_int
from ace3.training.loggers.base import Logger, LoggerArgumentError

__all__ = ["TrainingLogger"]


def _json_number(value: float) -> float | None:
    return value if math.isfinite(value) else None


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
        self.log_dir = checked_path(owner, "log_dir", log_dir)
        self.log_interval = positive_int(owner, "log_interval", log_interval)
        self.save_checkpoints = flag(owner, "save_checkpoints", save_checkpoints)
        self.checkpoint_interval = positive_int(owner, "checkpoint_interval", checkpoint_interval)
        self.verbose = flag(owner, "verbose", verbose)
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
        from ace3.runtime.observe.logger_hooks import LoggerMetricsHook

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
