"""The database snapshot ``/metrics`` serves, read at most once per ``ttl`` seconds per process.

Every scrape of an open ``/metrics`` would otherwise run the database aggregates (each up to
the statement timeout, on a connection of the API's pool): a few concurrent scrapes could hold
the connections ``/v1`` needs. Here one lock admits one reader at a time; scrapes that arrive
while it reads wait for it (holding no connection) and reuse what it read, as do the scrapes of
the next ``ttl`` seconds. A failed read (``None``) is remembered just as long, so a slow or
failing database is not asked again by every scrape.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from ace3_server.metrics.database import DatabaseSnapshot

logger = logging.getLogger(__name__)


class SnapshotCache:
    def __init__(self, ttl_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_seconds = ttl_seconds
        self._clock = clock
        self._lock = asyncio.Lock()
        self._value: DatabaseSnapshot | None = None
        self._read_at: float | None = None

    async def get(self, read: Callable[[], Awaitable[DatabaseSnapshot]]) -> DatabaseSnapshot | None:
        """The remembered snapshot while fresh, else ``read()``'s (None when it raised)."""
        async with self._lock:
            if self._read_at is not None and self._clock() - self._read_at < self.ttl_seconds:
                return self._value
            value: DatabaseSnapshot | None
            try:
                value = await read()
            except Exception:  # a scrape still reports this process's metrics and database_up 0
                logger.warning("/metrics could not read the database", exc_info=True)
                value = None
            self._value, self._read_at = value, self._clock()
            return value
