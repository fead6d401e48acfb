"""``GET /openai/v1/fine_tuning/jobs/{id}/events``: a job's story as ``fine_tuning.job.event``
objects, newest first: its state changes (created, started, ended; from the job row), the
service's log lines (``job_logs``, type ``message``) and one ``metrics`` event a reported step
(``job_metrics``: ``data`` holds ``step`` and each metric, the losses under OpenAI's names).

Events are ordered by (time, source, sequence): metrics before logs before state changes at
the same instant. An event id names its source and sequence (``ftevent-log-<seq>``,
``ftevent-metrics-<step>``, ``ftevent-state-<n>``), so ``after`` reads each source from that
point with a bounded query."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

from fastapi import Query
from sqlalchemy import ColumnElement, and_, false, func, or_, select, true
from sqlalchemy.ext.asyncio import AsyncSession

from ace3_control.models import Job, JobLog, JobMetric
from ace3_server.api.deps import OwnerDep, SessionDep
from ace3_server.api.params import StoredText
from ace3_server.openai_api.errors import OpenAIError
from ace3_server.openai_api.objects import openai_metric_name, unix

PREFIX = "ftevent"
METRICS, LOG, STATE = 0, 1, 2  # the order of sources at one instant
_SOURCES = {"metrics": METRICS, "log": LOG, "state": STATE}
_NAMES = {rank: name for name, rank in _SOURCES.items()}
Key = tuple[datetime, int, int]  # (time, source, sequence)


@dataclass
class Event:
    key: Key
    level: str
    message: str
    type: str = "message"
    data: dict[str, Any] | None = None

    def as_object(self) -> dict[str, Any]:
        moment, source, seq = self.key
        return {
            "id": f"{PREFIX}-{_NAMES[source]}-{seq}",
            "object": "fine_tuning.job.event",
            "created_at": unix(moment),
            "level": self.level,
            "message": self.message,
            "type": self.type,
            "data": self.data or {},
        }


def state_events(job: Job) -> list[Event]:
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
    return events


def _before(moment: Any, seq: Any, source: int, anchor: Key | None) -> ColumnElement[bool]:
    """SQL for a row of ``source`` at (``moment``, ``seq``) coming after ``anchor`` newest
    first, i.e. ordered before it."""
    if anchor is None:
        return true()
    at, anchor_source, anchor_seq = anchor
    if source < anchor_source:
        tie: ColumnElement[bool] = moment == at
    elif source == anchor_source:
        tie = and_(moment == at, seq < anchor_seq)
    else:
        tie = false()
    return or_(moment < at, tie)


async def _anchor(session: AsyncSession, job: Job, after: str) -> Key:
    prefix, _, rest = after.partition("-")
    source, _, seq_text = rest.partition("-")
    if prefix != PREFIX or source not in _SOURCES or not seq_text.isdigit():
        raise OpenAIError(400, f"no event {after!r} of this job", param="after")
    seq, rank = int(seq_text), _SOURCES[source]
    moment: datetime | None = None
    if rank == STATE:
        moment = next((e.key[0] for e in state_events(job) if e.key[2] == seq), None)
    elif rank == LOG and seq < 2**63:
        row = await session.get(JobLog, seq)
        moment = row.created_at if row is not None and row.job_id == job.id else None
    elif seq < 2**31:
        moment = await session.scalar(
            select(func.max(JobMetric.created_at)).where(
                JobMetric.job_id == job.id, JobMetric.step == seq
            )
        )
    if moment is None:
        raise OpenAIError(400, f"no event {after!r} of this job", param="after")
    return (moment, rank, seq)


async def _log_events(
    session: AsyncSession, job_id: str, anchor: Key | None, count: int
) -> list[Event]:
    rows = await session.scalars(
        select(JobLog)
        .where(JobLog.job_id == job_id, _before(JobLog.created_at, JobLog.id, LOG, anchor))
        .order_by(JobLog.created_at.desc(), JobLog.id.desc())
        .limit(count)
    )
    return [
        Event((row.created_at, LOG, row.id), "warn" if row.stream == "stderr" else "info", row.line)
        for row in rows
    ]


async def _metric_events(
    session: AsyncSession, job_id: str, anchor: Key | None, count: int
) -> list[Event]:
    steps = (
        select(JobMetric.step, func.max(JobMetric.created_at).label("at"))
        .where(JobMetric.job_id == job_id)
        .group_by(JobMetric.step)
        .subquery()
    )
    found = (
        await session.execute(
            select(steps.c.step, steps.c.at)
            .where(_before(steps.c.at, steps.c.step, METRICS, anchor))
            .order_by(steps.c.at.desc(), steps.c.step.desc())
            .limit(count)
        )
    ).all()
    values: dict[int, dict[str, Any]] = {step: {"step": step} for step, _ in found}
    rows = await session.scalars(
        select(JobMetric).where(JobMetric.job_id == job_id, JobMetric.step.in_(list(values)))
    )
    for row in rows:
        values[row.step][openai_metric_name(row.name)] = row.value
    events = []
    for step, at in found:
        data = values[step]
        shown = ", ".join(f"{k}={v:.4g}" for k, v in data.items() if k != "step")
        events.append(Event((at, METRICS, step), "info", f"Step {step}: {shown}", "metrics", data))
    return events


async def list_job_events(
    job_id: StoredText,
    session: SessionDep,
    owner_id: OwnerDep,
    after: Annotated[StoredText | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
) -> dict[str, Any]:
    """The job's events, newest first (see the module docstring)."""
    job = await session.get(Job, job_id)
    if job is None or job.owner_id != owner_id:
        raise OpenAIError(404, f"no fine-tuning job {job_id!r}", param="fine_tuning_job_id")
    anchor = await _anchor(session, job, after) if after else None
    events = [e for e in state_events(job) if anchor is None or e.key < anchor]
    events += await _log_events(session, job.id, anchor, limit + 1)
    events += await _metric_events(session, job.id, anchor, limit + 1)
    events.sort(key=lambda event: event.key, reverse=True)
    data = [event.as_object() for event in events[:limit]]
    return {"object": "list", "data": data, "has_more": len(events) > limit}
