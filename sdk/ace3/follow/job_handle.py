"""What a training run gives back: :class:`TrainingResult` for a finished job, and
:class:`JobHandle` to follow, wait on or cancel a job that is still running."""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ace3.client.resources import Checkpoint, Job, JobEvent, JobState, LogLine, LogPage, Metric
from ace3.errors import JobCancelledError, JobFailedError

if TYPE_CHECKING:
    from ace3.client import Client

LOG_TAIL_LINES = 20


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
        accuracies = [value for _, value in history.get("val_accuracy", [])]
        losses = [value for _, value in history.get("val_loss", [])]
        best_accuracy = max(accuracies) if accuracies else _number(final.get("best_val_accuracy"))
        best_loss = min(losses) if losses else _number(final.get("best_val_loss"))
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


class JobHandle:
    """A submitted job: follow it, wait for it, cancel it, read what it reported."""

    def __init__(self, job: Job | str, client: Client):
        self._client = client
        if isinstance(job, Job):
            self.id = job.id
            self.job: Job | None = job
        else:
            self.id = job
            self.job = None

    def __repr__(self) -> str:
        state = self.job.state if self.job is not None else "?"
        return f"JobHandle(id={self.id!r}, state={str(state)!r})"

    @property
    def client(self) -> Client:
        return self._client

    @property
    def state(self) -> JobState | str | None:
        """The state last seen (call :meth:`refresh` for the current one)."""
        return self.job.state if self.job is not None else None

    def refresh(self) -> Job:
        self.job = self._client.jobs.retrieve(self.id)
        return self.job

    def cancel(self) -> Job:
        """Ask the job to stop; returns at once (the job goes through ``cancelling``)."""
        self.job = self._client.jobs.cancel(self.id)
        return self.job

    def metrics(self, *, name: str | None = None, since_step: int | None = None) -> list[Metric]:
        return self._client.jobs.metrics(self.id, name=name, since_step=since_step)

    def logs(self, *, after: int | None = None, limit: int | None = None) -> LogPage:
        return self._client.jobs.logs(self.id, after=after, limit=limit)

    def checkpoints(self) -> list[Checkpoint]:
        return self._client.jobs.checkpoints(self.id)

    def download_checkpoint(
        self,
        checkpoint: str | Checkpoint | None = None,
        to: str | os.PathLike[str] = ".",
        *,
        verify: bool = True,
    ) -> Path:
        """Download a checkpoint (the latest one when ``checkpoint`` is None) to ``to``."""
        if checkpoint is None:
            checkpoints = self.checkpoints()
            if not checkpoints:
                raise ValueError(f"job {self.id} has no checkpoint yet")
            checkpoint = max(checkpoints, key=lambda item: (item.step or 0, item.created_at or 0))
        return self._client.jobs.download_checkpoint(self.id, checkpoint, to, verify=verify)

    def stream_events(self, **kwargs: Any) -> Iterator[JobEvent]:
        """The job's live events (``state``, ``metric``, ``log``, then ``end``)."""
        return self._client.jobs.events(self.id, **kwargs)

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

        mode = "none" if show_progress is None else ("auto" if show_progress else "plain")
        tail: deque[LogLine] = deque(maxlen=LOG_TAIL_LINES)
        final_job: Job | None = None
        hook_failed = False
        display = create_display(self.job, self._config(), mode=mode)
        started = time.monotonic()
        try:
            with display:
                for event in self.stream_events(timeout=timeout):
                    display.handle(event)
                    if on_event is not None:
                        try:
                            on_event(event)
                        except Exception as exc:  # a follower must not end the wait
                            if not hook_failed:
                                display.note(f"warning: following job {self.id}: {exc!r}")
                            hook_failed = True
                    if isinstance(event.data, LogLine):
                        tail.append(event.data)
                    elif isinstance(event.data, Job):
                        self.job = event.data
                        if event.type == "end":
                            final_job = event.data
        except KeyboardInterrupt:
            if cancel_on_interrupt:
                self._cancel_after_interrupt(display)
            raise
        except TimeoutError as exc:
            waited = time.monotonic() - started
            raise TimeoutError(
                f"job {self.id} did not finish within {waited:.0f} s; it keeps running: "
                f"wait on it again with client.jobs.retrieve({self.id!r}) or cancel it"
            ) from exc
        if final_job is None:  # the stream ended without `end`: ask the job itself
            final_job = self.refresh()
        return self._outcome(final_job, list(tail))

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

    def _cancel_after_interrupt(self, display: Any) -> None:
        try:
            job = self.cancel()
        except Exception as exc:
            display.note(f"Interrupted; could not cancel job {self.id}: {exc}")
        else:
            display.note(
                f"Interrupted: cancelled job {self.id} (state {job.state}). "
                "It stops on the server shortly."
            )
