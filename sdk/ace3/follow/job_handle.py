"""What a training run gives back: :class:`TrainingResult` for a finished job, and
:class:`JobHandle` to follow, wait on or cancel a job that is still running."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ace3.client.types import (
    Checkpoint,
    Job,
    JobEnvironment,
    JobEvent,
    JobRecord,
    JobState,
    LogLine,
    LogPage,
    Metric,
)
from ace3.config.events import EvalSamplesRecord, InstabilityRecord
from ace3.errors import JobCancelledError, JobFailedError
from ace3.follow.display import display_mode
from ace3.follow.waiting import FollowedHandle

if TYPE_CHECKING:
    pass

LOG_TAIL_LINES = 20


def best_validation(
    history: dict[str, list[tuple[int, float]]],
) -> tuple[float | None, float | None]:
    """(highest ``val_accuracy``, lowest ``val_loss``) over a history; None where it has none."""
    accuracies = [value for _, value in history.get("val_accuracy", [])]
    losses = [value for _, value in history.get("val_loss", [])]
    return (max(accuracies) if accuracies else None, min(losses) if losses else None)


class MetricsView:
    """What every training result offers over its ``history`` and ``final_metrics``."""

    history: dict[str, list[tuple[int, float]]]
    final_metrics: dict[str, Any]

    def history_by_step(self) -> list[dict[str, float]]:
        """One dict per step that reported something: ``{"step": 10, "train_loss": ...}``."""
        rows: dict[int, dict[str, float]] = {}
        for name, points in self.history.items():
            for step, value in points:
                rows.setdefault(step, {"step": step})[name] = value
        return [rows[step] for step in sorted(rows)]

    def __getattr__(self, name: str) -> Any:
        # only reached when normal lookup failed: expose final metrics as attributes
        if name.startswith("_") or name == "final_metrics":
            raise AttributeError(name)
        final = self.__dict__.get("final_metrics") or {}
        if name in final:
            return final[name]
        raise AttributeError(
            f"{type(self).__name__} has no attribute or final metric {name!r}; "
            f"final metrics: {sorted(final)}"
        )


@dataclass
class TrainingResult(MetricsView):
    """A finished job and everything it reported.

    - ``history``: metric name -> ``[(step, value), ...]`` in step order;
      :meth:`history_by_step` gives the same as one dict per step.
    - ``final_metrics``: the job's final metrics (the last value of each metric when the
      server recorded none). Each is also an attribute: ``result.val_loss``.
    - ``best_val_accuracy`` (highest) and ``best_val_loss`` (lowest) over the validation
      epochs, None without validation.
    - ``checkpoints``: what the job saved (download with ``JobHandle.download_checkpoint``);
      ``logs_tail``: its last log lines.
    """

    job: Job
    history: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    final_metrics: dict[str, Any] = field(default_factory=dict)
    best_val_accuracy: float | None = None
    best_val_loss: float | None = None
    checkpoints: list[Checkpoint] = field(default_factory=list)
    logs_tail: list[LogLine] = field(default_factory=list)  # the last log lines
    metrics: list[Metric] = field(default_factory=list, repr=False)

    @property
    def job_id(self) -> str:
        return self.job.id

    @classmethod
    def from_job(
        cls,
        job: Job,
        metrics: list[Metric],
        checkpoints: list[Checkpoint] | None = None,
        logs_tail: list[LogLine] | None = None,
    ) -> TrainingResult:
        ordered = sorted(metrics, key=lambda metric: metric.step)
        history: dict[str, list[tuple[int, float]]] = {}
        for metric in ordered:
            history.setdefault(metric.name, []).append((metric.step, metric.value))
        final = dict(job.final_metrics or {}) or {
            name: points[-1][1] for name, points in history.items()
        }
        best_accuracy, best_loss = best_validation(history)
        if best_accuracy is None:
            best_accuracy = _number(final.get("best_val_accuracy"))
        if best_loss is None:
            best_loss = _number(final.get("best_val_loss"))
        if best_accuracy is None:
            best_accuracy = _number(final.get("val_accuracy"))
        if best_loss is None:
            best_loss = _number(final.get("val_loss"))
        return cls(
            job=job,
            history=history,
            final_metrics=final,
            best_val_accuracy=best_accuracy,
            best_val_loss=best_loss,
            checkpoints=list(checkpoints or []),
            logs_tail=list(logs_tail or []),
            metrics=ordered,
        )


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class JobHandle(FollowedHandle[Job, JobEvent]):
    """A submitted job: follow it, wait for it, cancel it, read what it reported."""

    kind = "job"
    resource_type = Job
    wait_again = "client.jobs.retrieve({id!r})"
    stops_after_cancel = "It stops on the server shortly."

    @property
    def job(self) -> Job | None:
        """The job as last seen (None until it was read)."""
        return self._last

    @job.setter
    def job(self, job: Job | None) -> None:
        self._last = job

    @property
    def phase(self) -> str | None:
        """What the job was doing last seen before its processes ran
        (``"preparing_environment"``), None otherwise (call :meth:`refresh` for now)."""
        return self._last.phase if self._last is not None else None

    @property
    def environment(self) -> JobEnvironment | None:
        """The environment its requirements resolved to, last seen (hash, state, packages);
        ``client.environments.get(handle.environment.hash)`` for all of it."""
        return self._last.environment if self._last is not None else None

    @property
    def requirements(self) -> list[str] | None:
        """The packages the job adds to the worker's Python (its config's and its model
        package's requirements.txt, merged); None: none."""
        return self._last.requirements if self._last is not None else None

    def _collection(self) -> Any:
        return self._client.jobs

    def metrics(self, *, name: str | None = None, since_step: int | None = None) -> list[Metric]:
        return self._client.jobs.metrics(self.id, name=name, since_step=since_step)

    def logs(self, *, after: int | None = None, limit: int | None = None) -> LogPage:
        return self._client.jobs.logs(self.id, after=after, limit=limit)

    def checkpoints(self) -> list[Checkpoint]:
        return self._client.jobs.checkpoints(self.id)

    def records(self, *, type: str | None = None) -> list[JobRecord]:
        """The job's typed records (``"instability"``, ``"preempted"``, ``"eval_samples"``),
        oldest first."""
        return self._client.jobs.records(self.id, type=type)

    def eval_samples(self) -> list[EvalSamplesRecord]:
        """What the model completed for ``eval_prompts`` at each validation, oldest first
        (each record's ``samples``: ``prompt``, ``completion``)."""
        return [
            item.record
            for item in self.records(type="eval_samples")
            if isinstance(item.record, EvalSamplesRecord)
        ]

    def instabilities(self) -> list[InstabilityRecord]:
        """What the instability guard found, oldest first (as an in-process run's
        ``result.instabilities``)."""
        return [
            item.record
            for item in self.records(type="instability")
            if isinstance(item.record, InstabilityRecord)
        ]

    def best_checkpoint(self) -> Checkpoint | None:
        """The job's best checkpoint by its ``checkpoint_monitor`` (``keep_best_checkpoint``);
        None while none has been measured (or without ``keep_best_checkpoint``)."""
        return next((item for item in self.checkpoints() if item.best), None)

    def download_checkpoint(
        self,
        checkpoint: str | Checkpoint | None = None,
        to: str | os.PathLike[str] = ".",
        *,
        verify: bool = True,
    ) -> Path:
        """Download a checkpoint (the latest one when ``checkpoint`` is None; the best one by
        ``checkpoint_monitor`` when it is ``"best"``) to ``to``."""
        if checkpoint == "best":
            best = self.best_checkpoint()
            if best is None:
                raise ValueError(
                    f"job {self.id} has no best checkpoint (yet): it needs "
                    "keep_best_checkpoint=True and a checkpoint with its monitored metric"
                )
            checkpoint = best
        if checkpoint is None:
            checkpoints = self.checkpoints()
            if not checkpoints:
                raise ValueError(f"job {self.id} has no checkpoint yet")
            checkpoint = max(checkpoints, key=lambda item: (item.step or 0, item.created_at or 0))
        return self._client.jobs.download_checkpoint(self.id, checkpoint, to, verify=verify)

    def result(self) -> TrainingResult:
        """The result of a job that already succeeded (see :meth:`wait` for a running one)."""
        job = self.refresh()
        return self._outcome(job, [])

    def wait(
        self,
        timeout: float | None = None,
        *,
        show_progress: bool | None = None,
        cancel_on_interrupt: bool = False,
        on_event: Callable[[JobEvent], None] | None = None,
    ) -> TrainingResult:
        """Follow the job until it ends; return its :class:`TrainingResult`.

        Raises :class:`~ace3.errors.JobFailedError` (with the last log lines) or
        :class:`~ace3.errors.JobCancelledError`, and ``TimeoutError`` after ``timeout``
        seconds (the job keeps running). ``show_progress``: None shows nothing, True a live
        progress bar (plain lines when stdout is not a terminal), False plain lines.
        With ``cancel_on_interrupt``, Ctrl-C cancels the job before re-raising.
        ``on_event`` is called with every event after the display has shown it; an error it
        raises is shown as a note once and does not stop the wait.
        """
        from ace3.follow.job_display import create_display

        tail: deque[LogLine] = deque(maxlen=LOG_TAIL_LINES)

        def observe(event: JobEvent) -> None:
            if isinstance(event.data, LogLine):
                tail.append(event.data)
            if on_event is not None:
                on_event(event)

        display = create_display(self.job, self._config(), mode=display_mode(show_progress))
        self._note_queue_place(display, show_progress)
        final = self._follow(
            display, timeout=timeout, cancel_on_interrupt=cancel_on_interrupt, on_event=observe
        )
        return self._outcome(final, list(tail))

    def _note_queue_place(self, display: Any, show_progress: bool | None) -> None:
        """A queued job's place in the queue and why it waits, once, before following it."""
        from ace3.follow.job_display import queue_note

        job = self.job  # (as created: the service says where it is in the queue)
        if show_progress is None or job is None:
            return
        if note := queue_note(job):
            display.note(f"job {job.id}: {job.state}{note}")

    def _config(self) -> dict[str, Any]:
        return dict(self.job.config) if self.job is not None else {}

    def _outcome(self, job: Job, tail: list[LogLine]) -> TrainingResult:
        self.job = job
        if job.state == JobState.FAILED:
            if not tail:
                tail = self._last_log_lines()
            raise JobFailedError(job, tail)
        if job.state == JobState.CANCELLED:
            raise JobCancelledError(job)
        if job.state != JobState.SUCCEEDED:
            raise RuntimeError(f"job {job.id} has not finished: it is {job.state}")
        metrics = self.metrics()
        checkpoints = self.checkpoints()
        return TrainingResult.from_job(job, metrics, checkpoints, tail)

    def _last_log_lines(self) -> list[LogLine]:
        tail: deque[LogLine] = deque(maxlen=LOG_TAIL_LINES)
        try:
            tail.extend(self._client.jobs.iter_logs(self.id))
        except Exception:  # the failure matters more than its logs
            return []
        return list(tail)
