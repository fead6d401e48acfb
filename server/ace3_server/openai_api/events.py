"""``GET /openai/v1/fine_tuning/jobs/{id}/events``: a job's story as ``fine_tuning.job.event``
objects, newest first: its state changes (created, started, ended; from the job row), the
service's log lines (``job_logs``, type ``message``) and one ``metrics`` event a reported step
(``job_metrics``: ``data`` holds ``step`` and each metric, the losses under OpenAI's names).

Three sources, each read newest first along its own index: the logs by id (``(job_id, id)``),
the metrics by step (``(job_id, step, name)``), the state changes by their order. A page merges
them by time (metrics before logs before state changes at the same instant). An event's id
holds its source and sequence and, for each source, the sequence of that source's next event
after it (``ftevent-log-<seq>-<metrics>-<log>-<state>``, ``x`` where none follows), so ``after``
reads each source from where the page left it: a page costs the same however deep it is."""

from __future__ import annotations

import heapq
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any

from fastapi import Query
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from ace3.config.events import MAX_METRICS_PER_RECORD
from ace3_control.models import Job, JobLog, JobMetric
from ace3_server.api.deps import OwnerDep, SessionDep
from ace3_server.api.params import StoredText
from ace3_server.openai_api.errors import OpenAIError
from ace3_server.openai_api.objects import openai_metric_name, unix
from ace3_server.openai_api.owned import owned_job

PREFIX = "ftevent"
METRICS, LOG, STATE = 0, 1, 2  # the order of sources at one instant
SOURCES = (METRICS, LOG, STATE)
_NAMES = {METRICS: "metrics", LOG: "log", STATE: "state"}
_CURSOR = re.compile(r"ftevent-(metrics|log|state)-(\d{1,19})((?:-(?:\d{1,19}|x)){3})")
#: Per source, the highest sequence still to show (None: nothing more of it).
Bounds = dict[int, int | None]
_FIRST_PAGE: Bounds = {source: 2**63 - 1 for source in SOURCES}


@dataclass
class Event:
    key: tuple[datetime, int, int]  # (time, source, sequence)
    level: str
    message: str
    type: str = "message"
    data: dict[str, Any] | None = None
    next_seqs: Bounds = field(default_factory=dict)  # what follows it, per source

    def as_object(self) -> dict[str, Any]:
        moment, source, seq = self.key
        follows = "-".join("x" if n is None else str(n) for n in self.next_seqs.values())
        return {
            "id": f"{PREFIX}-{_NAMES[source]}-{seq}-{follows}",
            "object": "fine_tuning.job.event",
            "created_at": unix(moment),
            "level": self.level,
            "message": self.message,
            "type": self.type,
            "data": self.data or {},
        }


def state_events(job: Job) -> list[Event]:
    """The job's state changes, newest first."""
    events = [Event((job.created_at, STATE, 0), "info", f"Created fine-tuning job: {job.id}")]
    if job.started_at is not None:
        events.append(Event((job.started_at, STATE, 1), "info", "Fine-tuning job started"))
    if job.finished_at is not None and job.state == "succeeded":
        message = "The job has successfully completed"
        if job.fine_tuned_model_id:
            message += f"; new fine-tuned model: {job.fine_tuned_model_id}"
        events.append(Event((job.finished_at, STATE, 2), "info", message))
    elif job.finished_at is not None and job.state == "failed":
        events.append(Event((job.finished_at, STATE, 2), "error", f"The job failed: {job.error}"))
    elif job.finished_at is not None and job.state == "cancelled":
        events.append(Event((job.finished_at, STATE, 2), "info", "The job was cancelled"))
    return events[::-1]


def parse_after(after: str) -> Bounds:
    """The bounds an event id carries; 400 naming ``after`` for anything else."""
    found = _CURSOR.fullmatch(after)
    if found is None:
        raise OpenAIError(400, f"no event {after!r} of this job", param="after")
    seqs = found.group(3).split("-")[1:]
    return {s: None if seq == "x" else int(seq) for s, seq in zip(SOURCES, seqs, strict=True)}


async def _log_events(session: AsyncSession, job_id: str, bound: int, count: int) -> list[Event]:
    rows = await session.scalars(
        select(JobLog)
        .where(JobLog.job_id == job_id, JobLog.id <= bound)
        .order_by(JobLog.id.desc())
        .limit(count)
    )
    return [
        Event((row.created_at, LOG, row.id), "warn" if row.stream == "stderr" else "info", row.line)
        for row in rows
    ]


async def _metric_events(session: AsyncSession, job_id: str, bound: int, count: int) -> list[Event]:
    steps = list(
        await session.scalars(
            select(JobMetric.step)
            .where(JobMetric.job_id == job_id, JobMetric.step <= min(bound, 2**31 - 1))
            .distinct()
            .order_by(JobMetric.step.desc())
            .limit(count)
        )
    )
    if not steps:
        return []
    rows = await session.execute(
        select(JobMetric.step, JobMetric.name, JobMetric.value, JobMetric.created_at)
        .where(JobMetric.job_id == job_id, JobMetric.step.between(steps[-1], steps[0]))
        .order_by(JobMetric.step.desc(), JobMetric.name)
        .limit(len(steps) * MAX_METRICS_PER_RECORD)
    )
    values: dict[int, dict[str, Any]] = {step: {"step": step} for step in steps}
    times: dict[int, datetime] = {}
    for step, name, value, created_at in rows:
        values[step][openai_metric_name(name)] = value
        times[step] = max(times.get(step, created_at), created_at)
    events, oldest = [], min(times.values())
    for step in steps:  # (a step past the row cap shows no values, at the oldest time read)
        data = values[step]
        shown = ", ".join(f"{k}={v:.4g}" for k, v in data.items() if k != "step")
        at = times.get(step, oldest)
        events.append(Event((at, METRICS, step), "info", f"Step {step}: {shown}", "metrics", data))
    return events


def _link(merged: list[Event]) -> None:
    """Set each event's ``next_seqs``: per source, its next event's sequence in ``merged``
    (None: none follows). Each source read one event more than a page shows, so a source
    with more events always has one read after every event a page shows: None means no more."""
    following: Bounds = {source: None for source in SOURCES}
    for event in reversed(merged):
        event.next_seqs = dict(following)
        following[event.key[1]] = event.key[2]


async def list_job_events(
    job_id: StoredText,
    session: SessionDep,
    owner_id: OwnerDep,
    after: Annotated[StoredText | None, Query(max_length=128)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
) -> dict[str, Any]:
    """The job's events, newest first (see the module docstring)."""
    job = await owned_job(session, owner_id, job_id)
    bounds = parse_after(after) if after else _FIRST_PAGE
    count = limit + 1
    read: dict[int, list[Event]] = {source: [] for source in SOURCES}
    if (bound := bounds[STATE]) is not None:
        read[STATE] = [e for e in state_events(job) if e.key[2] <= bound]
    if (bound := bounds[LOG]) is not None:
        read[LOG] = await _log_events(session, job.id, bound, count)
    if (bound := bounds[METRICS]) is not None:
        read[METRICS] = await _metric_events(session, job.id, bound, count)
    merged = list(heapq.merge(*read.values(), key=lambda event: event.key, reverse=True))
    _link(merged)
    data = [event.as_object() for event in merged[:limit]]
    return {"object": "list", "data": data, "has_more": len(merged) > limit}
