"""What wakes the search driver before its next tick (:class:`DriverWakes`)."""

from __future__ import annotations

import asyncio
import contextlib

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ace3_control.models import TERMINAL_STATES, Job
from ace3_server.services.stream_wake import StreamHub

# On SQLite (no notifications), how often the driver looks for a running trial that ended.
ENDED_POLL_SECONDS = 0.1


class DriverWakes:
    """What wakes the driver before its next tick: a search created or cancelled through this
    API process (:meth:`wake`), and a running trial's job that ended, so that its outcome is
    recorded and the next trial starts at once. On Postgres the API process's LISTEN
    connection tells of ended jobs (``hub``: migration 0015's ``ace3_job_ended``); on SQLite,
    which notifies nobody, the jobs of the running trials are looked up by id every
    ENDED_POLL_SECONDS while there are any. Each ended job wakes the driver once (a search
    whose pass keeps failing, or that another process drives, never makes it spin)."""

    def __init__(
        self, session_factory: async_sessionmaker[AsyncSession], hub: StreamHub | None
    ) -> None:
        self.session_factory = session_factory
        self.hub = hub
        self._jobs: set[str] = set()  # the jobs of the running trials of the last pass
        self._reported: set[str] = set()  # those that ended and woke the driver
        self._woken = asyncio.Event()
        if hub is not None:
            hub.observe_ended(self._notified)

    @property
    def jobs(self) -> set[str]:
        return self._jobs

    @jobs.setter
    def jobs(self, job_ids: set[str]) -> None:
        self._jobs = job_ids
        self._reported &= job_ids

    def wake(self) -> None:
        self._woken.set()

    def _notified(self, job_id: str | None) -> None:
        if job_id is None:  # (the listener reconnected: it may have missed some)
            self._woken.set()
        elif job_id in self._jobs and job_id not in self._reported:
            self._reported.add(job_id)
            self._woken.set()

    async def wait(self, timeout: float) -> None:
        """Until woken, at most ``timeout`` seconds. A job that ended before the last pass
        read the running trials (so before its notification could be matched) counts too."""
        deadline = asyncio.get_running_loop().time() + timeout
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(deadline):
                while not self._woken.is_set() and not await self._newly_ended():
                    if self.hub is not None:
                        await self._woken.wait()
                    else:
                        await asyncio.sleep(ENDED_POLL_SECONDS)
        self._woken.clear()

    async def _newly_ended(self) -> bool:
        pending = self._jobs - self._reported
        if not pending:
            return False
        async with self.session_factory() as session:
            ended = set(
                await session.scalars(
                    select(Job.id).where(Job.id.in_(pending), Job.state.in_(TERMINAL_STATES))
                )
            )
        self._reported |= ended
        return bool(ended)
