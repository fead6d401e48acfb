"""The API process's one LISTEN connection: Postgres notifications wake the streams.

Migration 0013's triggers ``NOTIFY ace3_stream, '<job id>'`` when a job's metrics, logs or
records are inserted or its streamed state changes; migration 0015's ``NOTIFY ace3_job_ended,
'<job id>'`` when a job reaches a final state. This loop listens on a connection of its own
(autocommit, named ``ace3-api-listen`` in ``pg_stat_activity``), wakes the hub's streams of
the notified job (or, for an ended job, the hub's observers: the search driver), and reconnects with backoff when the connection is lost; after each
(re)connect it wakes every stream once, since notifications sent while it was away are gone.
The streams' slow safety poll covers the time it is away.
"""

from __future__ import annotations

import asyncio
import logging

import psycopg

from ace3_control.db import libpq_url
from ace3_server.services.stream_wake import StreamHub

logger = logging.getLogger(__name__)

CHANNEL = "ace3_stream"
ENDED_CHANNEL = "ace3_job_ended"  # migration 0015: a job reached a final state
LISTENER_APPLICATION_NAME = "ace3-api-listen"
FIRST_BACKOFF_SECONDS = 0.1
MAX_BACKOFF_SECONDS = 5.0


async def run_stream_listener(database_url: str, hub: StreamHub) -> None:
    """Runs until cancelled."""
    conninfo = libpq_url(database_url)
    backoff = FIRST_BACKOFF_SECONDS
    while True:
        try:
            connection = await psycopg.AsyncConnection.connect(
                conninfo, autocommit=True, application_name=LISTENER_APPLICATION_NAME
            )
            async with connection:
                await connection.execute(f"LISTEN {CHANNEL}")
                await connection.execute(f"LISTEN {ENDED_CHANNEL}")
                hub.listening, backoff = True, FIRST_BACKOFF_SECONDS
                hub.connects += 1
                hub.wake_all()
                async for notification in connection.notifies():
                    if notification.channel == ENDED_CHANNEL:
                        hub.job_ended(notification.payload)
                    else:
                        hub.wake(notification.payload)
        except (psycopg.Error, OSError) as exc:
            logger.warning(
                "stream listener lost its connection (%s); reconnecting in %.1f s",
                type(exc).__name__,
                backoff,
            )
        finally:
            hub.listening = False
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
