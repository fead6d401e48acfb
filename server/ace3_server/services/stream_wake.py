"""Waking live event streams when their job's rows change, instead of polling.

One :class:`StreamHub` per API process holds a :class:`JobWakes` per followed job: a wake
counter that the process's one LISTEN connection (:mod:`ace3_server.services.stream_listener`)
bumps when Postgres notifies the job's id, and the reads in flight for that job. Streams of one
job at the same cursor share one read (``shared``), so the database sees one set of queries
per wake and cursor, however many clients follow the job.

A read started at wake count ``n`` sees every row whose notification arrived before it
started (Postgres delivers a notification after its transaction commits); a stream that saw
count ``n`` reads again as soon as the count moves past ``n``, so no wake is lost between a
read and the wait that follows it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Hashable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


def _retrieve(task: asyncio.Task[Any]) -> None:
    # (a read whose followers all left: its error is theirs, never "never retrieved")
    if not task.cancelled():
        task.exception()


class JobWakes:
    """One followed job: its wake count and the reads in flight, per cursor."""

    def __init__(self) -> None:
        self.count = 0
        self.followers = 0
        self._changed = asyncio.Event()
        self._reads: dict[Hashable, tuple[int, asyncio.Task[Any]]] = {}

    def wake(self) -> None:
        self.count += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_past(self, seen: int, timeout: float) -> bool:
        """Until the count moves past ``seen`` (True) or ``timeout`` seconds pass (False)."""
        if self.count != seen:
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._changed.wait()
        return self.count != seen

    async def shared(self, key: Hashable, read: Callable[[], Awaitable[T]]) -> tuple[int, T]:
        """``read()``'s result and the wake count it started at; a read of the same ``key``
        in flight since the current count is joined instead of started again."""
        entry = self._reads.get(key)
        if entry is None or entry[0] != self.count:
            task: asyncio.Task[T] = asyncio.ensure_future(read())
            entry = (self.count, task)
            self._reads[key] = entry

            def forget(done: asyncio.Task[Any], key: Hashable = key) -> None:
                if self._reads.get(key) is entry:
                    del self._reads[key]
                _retrieve(done)

            task.add_done_callback(forget)
        started, task = entry
        return started, await asyncio.shield(task)


class StreamHub:
    """The followed jobs of one API process, woken by job id."""

    def __init__(self) -> None:
        self._jobs: dict[str, JobWakes] = {}
        # Told of every job that reached a final state (None: some may have been missed).
        self._ended_observers: list[Callable[[str | None], None]] = []
        self.listening = False
        self.connects = 0  # (the listener's connections so far: a reconnect shows here)

    @contextlib.contextmanager
    def follow(self, job_id: str) -> Iterator[JobWakes]:
        wakes = self._jobs.get(job_id)
        if wakes is None:
            wakes = self._jobs[job_id] = JobWakes()
        wakes.followers += 1
        try:
            yield wakes
        finally:
            wakes.followers -= 1
            if not wakes.followers:
                del self._jobs[job_id]

    def wake(self, job_id: str) -> None:
        wakes = self._jobs.get(job_id)
        if wakes is not None:
            wakes.wake()

    def wake_all(self) -> None:
        """After the listener (re)connected: notifications may have been missed meanwhile."""
        for wakes in self._jobs.values():
            wakes.wake()
        for observer in self._ended_observers:
            observer(None)

    def observe_ended(self, observer: Callable[[str | None], None]) -> None:
        """Call ``observer`` with the id of every job that reaches a final state."""
        self._ended_observers.append(observer)

    def job_ended(self, job_id: str) -> None:
        for observer in self._ended_observers:
            observer(job_id)

    @property
    def followed_jobs(self) -> int:
        return len(self._jobs)
