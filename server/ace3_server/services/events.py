"""A job's live event stream (server-sent events), read from the database.

The database is the only source: the stream polls it for the job's state, new metrics and new
log lines, so any API replica can serve any client and a reconnecting client resumes exactly
from its last event id (``"<metrics_after>:<logs_after>"``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ace3_server.models import TERMINAL_STATES, Job, JobLog, JobMetric
from ace3_server.schemas import JobOut, LogOut, MetricOut

POLL_SECONDS = 0.25
KEEPALIVE_SECONDS = 15.0
BATCH_ROWS = 500


@dataclass
class Cursor:
    metrics_after: int = 0
    logs_after: int = 0

    @classmethod
    def parse(cls, last_event_id: str | None, metrics_after: int, logs_after: int) -> Cursor:
        if last_event_id:
            metrics_text, _, logs_text = last_event_id.partition(":")
            if metrics_text.isdigit() and logs_text.isdigit():
                return cls(int(metrics_text), int(logs_text))
        return cls(metrics_after, logs_after)

    def event_id(self) -> str:
        return f"{self.metrics_after}:{self.logs_after}"


def format_event(event: str, data: Any, event_id: str) -> str:
    payload = json.dumps(data, default=str, separators=(",", ":"))
    return f"id: {event_id}\nevent: {event}\ndata: {payload}\n\n"


def _job_payload(job: Job) -> dict[str, Any]:
    return JobOut.model_validate(job).model_dump(mode="json")


def _state_signature(job: Job) -> tuple[Any, ...]:
    return (job.state, job.attempt, job.cancel_requested, job.exit_code, job.error)


async def _new_rows(
    session: AsyncSession, job_id: str, cursor: Cursor
) -> tuple[list[JobMetric], list[JobLog]]:
    metrics = (
        await session.scalars(
            select(JobMetric)
            .where(JobMetric.job_id == job_id, JobMetric.id > cursor.metrics_after)
            .order_by(JobMetric.id)
            .limit(BATCH_ROWS)
        )
    ).all()
    logs = (
        await session.scalars(
            select(JobLog)
            .where(JobLog.job_id == job_id, JobLog.id > cursor.logs_after)
            .order_by(JobLog.id)
            .limit(BATCH_ROWS)
        )
    ).all()
    return list(metrics), list(logs)


async def job_events(
    session_factory: async_sessionmaker[AsyncSession],
    job_id: str,
    cursor: Cursor,
    is_disconnected: Callable[[], Any],
) -> AsyncIterator[str]:
    last_signature: tuple[Any, ...] | None = None
    last_sent = time.monotonic()
    while True:
        async with session_factory() as session:
            job = await session.get(Job, job_id)
            if job is None:
                return
            finished = job.state in TERMINAL_STATES
            metrics, logs = await _new_rows(session, job_id, cursor)
            chunks: list[str] = []
            signature = _state_signature(job)
            if signature != last_signature:
                last_signature = signature
                chunks.append(format_event("state", _job_payload(job), cursor.event_id()))
            for metric in metrics:
                cursor.metrics_after = metric.id
                chunks.append(
                    format_event(
                        "metric",
                        MetricOut.model_validate(metric).model_dump(mode="json"),
                        cursor.event_id(),
                    )
                )
            for log in logs:
                cursor.logs_after = log.id
                chunks.append(
                    format_event(
                        "log", LogOut.model_validate(log).model_dump(mode="json"), cursor.event_id()
                    )
                )
            drained = len(metrics) < BATCH_ROWS and len(logs) < BATCH_ROWS
            if finished and drained:
                chunks.append(format_event("end", _job_payload(job), cursor.event_id()))
        if chunks:
            last_sent = time.monotonic()
            yield "".join(chunks)
        if finished and drained:
            return
        if await is_disconnected():
            return
        if time.monotonic() - last_sent > KEEPALIVE_SECONDS:
            last_sent = time.monotonic()
            yield ": keep-alive\n\n"
        if drained:
            await asyncio.sleep(POLL_SECONDS)
