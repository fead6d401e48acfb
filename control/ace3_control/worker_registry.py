"""The worker registry: the rows workers keep alive, and which of them count as live.

Each worker process (``ace3 worker``) inserts a row when it starts, renews ``last_seen_at``
every ``ACE3_HEARTBEAT_SECONDS`` and deletes the row on a clean shutdown. A worker that was
killed leaves its row behind: it is gone once the row is older than the staleness window
(``ACE3_WORKER_STALE_AFTER_SECONDS``, default 3 heartbeats; never less than 3 of the worker's
own heartbeats, so a worker configured with a slower heartbeat does not flicker). Gone rows are
deleted by the reconciler after ``FORGET_AFTER``. Only workers consuming the API's queue count:
no other worker ever receives its jobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import Delete, Select, Update, delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from ace3_control.models import Worker, utcnow
from ace3_control.settings import Settings

STALE_HEARTBEATS = 3
FORGET_AFTER = timedelta(hours=1)


def stale_after(worker: Worker, settings: Settings) -> timedelta:
    """How long ``worker`` may stay silent before it counts as gone."""
    seconds = max(
        settings.resolved_worker_stale_after_seconds,
        STALE_HEARTBEATS * float(worker.heartbeat_seconds),
    )
    return timedelta(seconds=seconds)


def is_live(worker: Worker, settings: Settings, now: datetime | None = None) -> bool:
    now = now or utcnow()
    return now - worker.last_seen_at <= stale_after(worker, settings)


def workers_of_queue(queue: str) -> Select[Worker]:
    return select(Worker).where(Worker.queue == queue).order_by(Worker.started_at, Worker.id)


def live_among(
    workers: Sequence[Worker], settings: Settings, now: datetime | None = None
) -> list[Worker]:
    now = now or utcnow()
    return [worker for worker in workers if is_live(worker, settings, now)]


async def live_workers(
    session: AsyncSession, settings: Settings, now: datetime | None = None
) -> list[Worker]:
    """The live workers that consume this API's queue, oldest first."""
    rows = (await session.scalars(workers_of_queue(settings.queue_name))).all()
    return live_among(rows, settings, now)


def advertised_packages(workers: Sequence[Worker]) -> list[dict[str, str]]:
    """The installed sets (``{canonical name: version}``) the given workers advertise; workers
    that advertise none (started by an earlier release) are left out. A job's requirements are
    checked against these at submission: an environment only adds packages."""
    return [dict(worker.packages) for worker in workers if worker.packages]


def touch(worker_id: str, now: datetime | None = None) -> Update:
    """A heartbeat; no row changed means the row is gone (forgotten): insert it again."""
    return update(Worker).where(Worker.id == worker_id).values(last_seen_at=now or utcnow())


def forget(worker_id: str) -> Delete:
    return delete(Worker).where(Worker.id == worker_id)


def forget_long_gone(now: datetime | None = None) -> Delete:
    """Rows of workers silent for ``FORGET_AFTER`` (killed, never deregistered)."""
    return delete(Worker).where(Worker.last_seen_at < (now or utcnow()) - FORGET_AFTER)
