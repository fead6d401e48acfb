"""A job's live event stream (server-sent events), read from the database.

The database is the only source: the stream polls it for the job's state, new metrics, new
log lines and new typed records (``record`` events: instability, preempted), so any API replica
can serve any client and a reconnecting client resumes exactly from its last event id
(``"<metrics_after>:<logs_after>"``, with ``":<records_after>"`` once a record was sent; an id
without it resumes from the first record, which is what a stream that sent none had sent).

Each read opens a session and closes it before the stream waits: a follower holds no database
connection between reads. On Postgres a stream waits for its job's notification
(``stream_wake``, ``stream_listener``) or the slow safety poll, and the streams of one job at
the same cursor share one read; on SQLite, or with ACE3_STREAM_WAKE=poll, every stream reads
every POLL_SECONDS. If the database becomes unreachable the stream ends (with a ``retry:``
hint) and the client reconnects, to a 503 until it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ace3.config.events import EVAL_SAMPLES_PAGE
from ace3_control.db import DATABASE_UNAVAILABLE_ERRORS
from ace3_control.models import TERMINAL_STATES, Environment, Job, JobLog, JobMetric, JobRecord
from ace3_server.schemas import JobOut, LogOut, MetricOut, RecordOut
from ace3_server.services.environments import environments_of, job_environment
from ace3_server.services.stream_wake import JobWakes, StreamHub
from ace3_server.storable import INT64_MAX

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.25
KEEPALIVE_SECONDS = 15.0
BATCH_ROWS = 500
OUTAGE_RECONNECT_MILLISECONDS = 5000


@dataclass
class Cursor:
    metrics_after: int = 0
    logs_after: int = 0
    records_after: int = 0

    @classmethod
    def from_event_id(cls, event_id: str) -> Cursor | None:
        """The cursor of an event id ``"<metrics_after>:<logs_after>[:<records_after>]"``, or
        None if malformed."""
        parts = event_id.split(":")
        if len(parts) not in (2, 3):
            return None
        numbers = []
        for text in parts:
            if not (text.isascii() and text.isdigit() and len(text) <= 19):
                return None
            numbers.append(int(text))
        if max(numbers) > INT64_MAX:  # metric, log and record ids are BIGINT
            return None
        return cls(*numbers)

    def event_id(self) -> str:
        # (two numbers until a record was sent: the ids an older client knows)
        if self.records_after:
            return f"{self.metrics_after}:{self.logs_after}:{self.records_after}"
        return f"{self.metrics_after}:{self.logs_after}"


async def until_database_outage(stream: AsyncGenerator[str, None]) -> AsyncIterator[str]:
    """``stream``, ended cleanly when the database becomes unreachable: the client reconnects
    after the ``retry:`` delay (and meets 503s until the database is back)."""
    try:
        async with contextlib.aclosing(stream):
            async for chunk in stream:
                yield chunk
    except DATABASE_UNAVAILABLE_ERRORS as exc:
        logger.warning("ending a live stream: database unavailable: %s", type(exc).__name__)
        yield f"retry: {OUTAGE_RECONNECT_MILLISECONDS}\n\n"


def format_event(event: str, data: Any, event_id: str) -> str:
    payload = json.dumps(data, default=str, separators=(",", ":"))
    return f"id: {event_id}\nevent: {event}\ndata: {payload}\n\n"


def _job_payload(job: Job, environments: dict[str, Environment]) -> dict[str, Any]:
    out = JobOut.model_validate(job)
    out.environment = job_environment(job, environments)
    return out.model_dump(mode="json")


def _state_signature(job: Job, environments: dict[str, Environment]) -> tuple[Any, ...]:
    # (the plan too: it arrives after the job started running, and the progress bar needs it;
    # the phase and the environment's state: what a starting job is waiting for)
    environment = environments.get(job.environment_hash or "")
    return (
        job.state, job.attempt, job.cancel_requested, job.exit_code, job.error, job.plan,
        job.phase, job.environment_hash, environment.state if environment is not None else None,
    )  # fmt: skip


async def _rows_after(
    session: AsyncSession, model: Any, job_id: str, after: int, limit: int = BATCH_ROWS
) -> list[Any]:
    """The job's next rows of ``model`` (metrics, logs or records) after the cursor ``after``."""
    rows = await session.scalars(
        select(model)
        .where(model.job_id == job_id, model.id > after)
        .order_by(model.id)
        .limit(limit)
    )
    return list(rows.all())


async def _new_rows(
    session: AsyncSession, job_id: str, cursor: Cursor
) -> tuple[list[JobMetric], list[JobLog], list[JobRecord]]:
    return (
        await _rows_after(session, JobMetric, job_id, cursor.metrics_after),
        await _rows_after(session, JobLog, job_id, cursor.logs_after),
        await _rows_after(session, JobRecord, job_id, cursor.records_after, EVAL_SAMPLES_PAGE),
    )


@dataclass(frozen=True)
class Snapshot:
    """One read of a job for its stream from ``cursor``: the events it yields, formatted.

    Every stream at the same cursor yields the same events, so streams of one job share a
    snapshot (``stream_wake``); ``state`` goes out only to a stream whose last state differs.
    """

    signature: tuple[Any, ...]
    state: str
    rows: str
    end: str | None
    cursor: Cursor
    drained: bool


async def read_snapshot(
    session_factory: async_sessionmaker[AsyncSession], job_id: str, start: Cursor
) -> Snapshot | None:
    """The job's state and next rows after ``start`` (left as it is), or None if it is gone."""
    cursor = Cursor(start.metrics_after, start.logs_after, start.records_after)
    async with session_factory() as session:
        job = await session.get(Job, job_id)
        if job is None:
            return None
        finished = job.state in TERMINAL_STATES
        metrics, logs, records = await _new_rows(session, job_id, cursor)
        if metrics and job.plan is None:
            # The worker stores the plan before (or with) the first metrics: read after
            # them, it goes out no later than the first metric (the progress bar's total).
            await session.refresh(job, attribute_names=["plan"])
        environments = await environments_of(session, [job])
        state = format_event("state", _job_payload(job, environments), cursor.event_id())
        chunks: list[str] = []
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
        for record in records:
            cursor.records_after = record.id
            chunks.append(
                format_event(
                    "record",
                    RecordOut.model_validate(record).model_dump(mode="json"),
                    cursor.event_id(),
                )
            )
        drained = max(len(metrics), len(logs)) < BATCH_ROWS and len(records) < EVAL_SAMPLES_PAGE
        end = None
        if finished and drained:
            end = format_event("end", _job_payload(job, environments), cursor.event_id())
        return Snapshot(
            _state_signature(job, environments), state, "".join(chunks), end, cursor, drained
        )


@dataclass(frozen=True)
class Wakes:
    """How a stream waits for new rows: on ``hub``'s notifications, re-reading at least every
    ``safety_poll_seconds``; without a hub (SQLite, or ACE3_STREAM_WAKE=poll) it polls every
    POLL_SECONDS."""

    hub: StreamHub | None = None
    safety_poll_seconds: float = 5.0


async def job_events(
    session_factory: async_sessionmaker[AsyncSession],
    job_id: str,
    cursor: Cursor,
    is_disconnected: Callable[[], Any],
    wakes: Wakes | None = None,
) -> AsyncGenerator[str, None]:
    hub = wakes.hub if wakes else None
    with hub.follow(job_id) if hub else contextlib.nullcontext() as followed:
        async for chunk in _job_events(
            session_factory, job_id, cursor, is_disconnected, followed, wakes or Wakes()
        ):
            yield chunk


async def _job_events(
    session_factory: async_sessionmaker[AsyncSession],
    job_id: str,
    cursor: Cursor,
    is_disconnected: Callable[[], Any],
    followed: JobWakes | None,
    wakes: Wakes,
) -> AsyncGenerator[str, None]:
    last_signature: tuple[Any, ...] | None = None
    last_sent = time.monotonic()
    seen = 0
    while True:
        if followed is None:
            snapshot = await read_snapshot(session_factory, job_id, cursor)
        else:
            seen, snapshot = await followed.shared(
                (cursor.metrics_after, cursor.logs_after, cursor.records_after),
                functools.partial(read_snapshot, session_factory, job_id, cursor),
            )
        if snapshot is None:
            return
        chunks: list[str] = []
        if snapshot.signature != last_signature:
            last_signature = snapshot.signature
            chunks.append(snapshot.state)
        chunks.append(snapshot.rows)
        if snapshot.end is not None:
            chunks.append(snapshot.end)
        cursor = snapshot.cursor
        text = "".join(chunks)
        if text:
            last_sent = time.monotonic()
            yield text
        if snapshot.end is not None:
            return
        if await is_disconnected():
            return
        if time.monotonic() - last_sent > KEEPALIVE_SECONDS:
            last_sent = time.monotonic()
            yield ": keep-alive\n\n"
        if not snapshot.drained:
            continue
        if followed is None:
            await asyncio.sleep(POLL_SECONDS)
        else:
            keepalive_due = KEEPALIVE_SECONDS - (time.monotonic() - last_sent)
            await followed.wait_past(seen, max(0.05, min(wakes.safety_poll_seconds, keepalive_due)))
