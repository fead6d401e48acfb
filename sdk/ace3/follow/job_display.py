"""Show a job's progress while waiting on it, fed by its event stream.

On a terminal: a live rich progress bar over optimizer steps with the latest train_loss,
val_loss, val_accuracy and samples/s, and log lines printed above it. Elsewhere (CI, notebooks,
pipes) or with ``show_progress=False``: plain lines, one per reported step, log line or state
change. ``rich`` is imported only when the live display is used.
"""

from __future__ import annotations

import math
import re
from typing import Any, TextIO

from ace3.client.types import Job, JobEvent, LogLine, Metric
from ace3.config.events import RunPlan, echoes_metrics
from ace3.follow.display import DisplayMode, FollowDisplay, choose_display, format_value

# The engine's one-series-per-rank figures (memory_mb_rank3, ...): kept in the job's metrics,
# left out of the plain lines, which show their max / min and the rank of the max.
PER_RANK_SERIES = re.compile(r"_rank\d+\Z")

# Shown on the bar, in this order, with short labels.
HEADLINE_METRICS = (
    ("train_loss", "loss"),
    ("val_loss", "val_loss"),
    ("val_accuracy", "val_acc"),
    ("samples_per_sec", "samples/s"),
)


def create_display(
    job: Job | None,
    config: dict[str, Any] | None = None,
    *,
    mode: DisplayMode = "auto",
    file: TextIO | None = None,
) -> Display:
    """The display for ``mode``: ``auto`` = live bar on a terminal, plain lines elsewhere."""
    display, out = choose_display(mode, file, Display, PlainDisplay, RichDisplay)
    return display(job, config, out)


def state_text(job: Job) -> str:
    """The job's state as the displays show it: ``starting: preparing environment`` while a
    starting job's environment is prepared (its ``phase``), else the state."""
    if job.phase and not job.is_terminal:
        return f"{job.state}: {job.phase.replace('_', ' ')}"
    return str(job.state)


def queue_note(job: Job) -> str:
    """`` (position 3 in the queue, waiting for quota)`` for a queued job whose place is known;
    else empty."""
    if job.state != "queued" or job.queue_position is None:
        return ""
    why = {
        "quota": "its owner's quota",
        "capacity": "a free worker",
        "priority": "the jobs ahead of it",
    }.get(job.waiting_reason or "", job.waiting_reason)
    return f" (position {job.queue_position} in the queue" + (
        f", waiting for {why})" if why else ")"
    )


class StepEstimator:
    """The total number of optimizer steps, once it can be known.

    The run's plan (``job.plan``: the engine's ``start`` record, written before the first step)
    gives it exactly, from step 1. Without one (a server older than the plan), it is estimated:
    ``epochs * steps_per_epoch``, capped by ``max_steps``, with the steps of an epoch learnt from
    ``epoch_train_loss`` (reported once at the end of every epoch); unknown (None) until then,
    unless ``max_steps`` bounds it.
    """

    def __init__(self, config: dict[str, Any] | None, plan: RunPlan | None = None):
        config = config or {}
        self.epochs: int | None = config.get("epochs") or (None if config.get("max_steps") else 3)
        self.max_steps: int | None = config.get("max_steps")
        self.steps_per_epoch: float | None = None
        self.planned: int | None = None
        if plan is not None:
            self.use_plan(plan)

    def use_plan(self, plan: RunPlan) -> None:
        self.planned = plan.total_steps

    def observe(self, metric: Metric) -> None:
        if self.steps_per_epoch is not None or metric.step <= 0:
            return
        if metric.name == "epoch_train_loss" and metric.epoch:
            self.steps_per_epoch = metric.step / metric.epoch

    @property
    def total(self) -> int | None:
        if self.planned:
            return self.planned
        estimate = None
        if self.steps_per_epoch and self.epochs:
            estimate = math.ceil(self.epochs * self.steps_per_epoch - 1e-6)
        if self.max_steps:
            return min(self.max_steps, estimate) if estimate else self.max_steps
        return estimate


class Display(FollowDisplay):
    """Shows nothing; the base of the job displays (which override the ``_on_*`` hooks)."""

    def __init__(self, job: Job | None, config: dict[str, Any] | None, out: TextIO):
        super().__init__(out)
        self.job = job
        self.steps = StepEstimator(
            config if config is not None else (job.config if job else {}),
            job.plan if job is not None else None,
        )
        self.step = 0
        self.latest: dict[str, float] = {}

    def handle(self, event: JobEvent) -> None:
        data = event.data
        if isinstance(data, Metric):
            self.steps.observe(data)
            self.step = max(self.step, data.step)
            self.latest[data.name] = data.value
            self._on_metric(data)
        elif isinstance(data, LogLine):
            self._on_log(data)
        elif isinstance(data, Job):
            previous = (self.job.state, self.job.phase) if self.job is not None else None
            if self.job is None or not self.job.config:
                self.steps = _keep_estimate(self.steps, StepEstimator(data.config))
            if data.plan is not None:
                self.steps.use_plan(data.plan)
            self.job = data
            if event.type == "end":
                self._on_end(data)
            elif (data.state, data.phase) != previous:
                self._on_state(data)

    def _on_metric(self, metric: Metric) -> None:
        pass

    def _on_log(self, line: LogLine) -> None:
        pass

    def _on_state(self, job: Job) -> None:
        pass

    def _on_end(self, job: Job) -> None:
        pass

    def _end_message(self, job: Job) -> str:
        text = f"job {job.id} {job.state} after {self._elapsed()}"
        if job.error:
            text += f": {job.error}"
        final = job.final_metrics or {}
        shown = [
            f"{name}={format_value(value)}"
            for name, value in final.items()
            if isinstance(value, int | float) and not isinstance(value, bool)
        ]
        if shown:
            text += " | " + " ".join(shown)
        return text


def _keep_estimate(old: StepEstimator, new: StepEstimator) -> StepEstimator:
    new.steps_per_epoch, new.planned = old.steps_per_epoch, old.planned
    return new


class PlainDisplay(Display):
    """One line per reported step, log line and state change; no terminal control codes."""

    def __init__(self, job: Job | None, config: dict[str, Any] | None, out: TextIO):
        super().__init__(job, config, out)
        self._pending_step: int | None = None
        self._pending_epoch: float | None = None
        self._pending: dict[str, float] = {}

    def close(self) -> None:
        self._flush()
        super().close()

    def _flush(self) -> None:
        if self._pending_step is None or not self._pending:
            return
        total = self.steps.total
        position = f"step {self._pending_step}" + (f"/{total}" if total else "")
        epoch = self._pending.pop("epoch", self._pending_epoch)
        if epoch is not None:
            position += f" epoch {format_value(epoch)}"
        values = " ".join(f"{name}={format_value(value)}" for name, value in self._pending.items())
        self.note(f"{position}: {values}" if values else position)
        self._pending = {}
        self._pending_step = None
        self._pending_epoch = None

    def _on_metric(self, metric: Metric) -> None:
        if self._pending_step is not None and metric.step != self._pending_step:
            self._flush()
        self._pending_step = metric.step
        if metric.epoch is not None:
            self._pending_epoch = metric.epoch
        if not PER_RANK_SERIES.search(metric.name):  # (their max / min / argmax are shown)
            self._pending[metric.name] = metric.value

    def _on_log(self, line: LogLine) -> None:
        if line.rank in (None, 0) and echoes_metrics(line.line):
            return  # the engine's echo of the metrics this display prints as they arrive
        self._flush()
        self.note(line.format())

    def _on_start(self) -> None:
        if self.job is not None:
            self.note(f"job {self.job.id}: {state_text(self.job)}")

    def _on_state(self, job: Job) -> None:
        self._flush()
        if not job.is_terminal:  # the end line reports the final state
            self.note(f"job {job.id}: {state_text(job)}{queue_note(job)}")

    def _on_end(self, job: Job) -> None:
        self._flush()
        self.note(self._end_message(job))


class RichDisplay(Display):
    """A live progress bar (rich) with the headline metrics; logs scroll above it."""

    def __init__(self, job: Job | None, config: dict[str, Any] | None, out: TextIO):
        super().__init__(job, config, out)
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )
        from rich.table import Column

        self._console = Console(file=out)
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}", markup=False),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn(
                "{task.fields[metrics]}",
                markup=False,
                table_column=Column(no_wrap=True, overflow="ellipsis", ratio=1),
            ),
            console=self._console,
            expand=True,  # the metrics column takes what is left, the bar keeps its width
            transient=False,
        )
        self._task = self._progress.add_task(self._description(), total=None, metrics="")
        self._progress.start()

    def _stop_live(self) -> None:
        self._progress.stop()

    def _description(self) -> str:
        if self.job is None:
            return "job"
        return f"{self.job.name or 'job ' + self.job.id[:8]} {state_text(self.job)}"

    def _refresh(self) -> None:
        metrics = " ".join(
            f"{label}={format_value(self.latest[name])}"
            for name, label in HEADLINE_METRICS
            if name in self.latest
        )
        self._progress.update(
            self._task,
            completed=self.step,
            total=self.steps.total,
            description=self._description(),
            metrics=metrics,
        )

    def _on_metric(self, metric: Metric) -> None:
        self._refresh()

    def _on_log(self, line: LogLine) -> None:
        self.note(line.format())

    def _on_state(self, job: Job) -> None:
        self._refresh()

    def _on_end(self, job: Job) -> None:
        if job.state == "succeeded":  # fill the bar: the run is complete
            if self.steps.total is None:
                self.steps.max_steps = self.step or None
            else:
                self.step = self.steps.total
        self._refresh()
        self.close()
        self.note(self._end_message(job))
