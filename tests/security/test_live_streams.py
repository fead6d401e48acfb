"""Live streams hold no database connection while they wait: 60 followers of one job's events
all get its events, a plain GET stays fast, and the API keeps no transaction open meanwhile."""

from __future__ import annotations

import asyncio
import time

import httpx
import psycopg

from ace3_server.app import API_APPLICATION_NAME
from tests.conftest import Stack
from tests.security.conftest import finish_job, insert_running_job

FOLLOWERS = 60
METRICS = 3
LOGS = 2


async def _follow(
    client: httpx.AsyncClient, job_id: str, caught_up: asyncio.Event, seen: list[str]
) -> None:
    """Read the stream, flag when the job's first rows arrived, return at its ``end``."""
    async with client.stream("GET", f"/v1/jobs/{job_id}/events") as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if not line.startswith("event: "):
                continue
            seen.append(line.removeprefix("event: "))
            if seen.count("metric") == METRICS and seen.count("log") == LOGS:
                caught_up.set()
            if seen[-1] == "end":
                return


def _long_idle_transactions(database_url: str) -> list[tuple[str, str]]:
    """(state, query) of the API's connections idle in a transaction for over two seconds (a
    poll's own transaction is idle for milliseconds between its queries)."""
    with psycopg.connect(database_url, autocommit=True) as connection:
        rows = connection.execute(
            "SELECT state, query FROM pg_stat_activity WHERE application_name = %s "
            "AND state LIKE 'idle in transaction%%' AND state_change < now() - interval '2 seconds'",
            (API_APPLICATION_NAME,),
        ).fetchall()
    return [(str(state), str(query)) for state, query in rows]


async def test_sixty_followers_hold_no_connection_while_they_wait(
    stack: Stack, database_url: str, api_key: tuple[str, str]
) -> None:
    key, owner_id = api_key
    job_id = insert_running_job(database_url, owner_id, metrics=METRICS, logs=LOGS)
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=FOLLOWERS + 5)
    async with httpx.AsyncClient(
        base_url=stack.base_url, headers=headers, limits=limits, timeout=30
    ) as client:
        caught_up = [asyncio.Event() for _ in range(FOLLOWERS)]
        seen: list[list[str]] = [[] for _ in range(FOLLOWERS)]
        followers = [
            asyncio.create_task(_follow(client, job_id, caught_up[index], seen[index]))
            for index in range(FOLLOWERS)
        ]
        try:
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in caught_up)), timeout=20)
            await asyncio.sleep(2.5)  # every stream waits for more, longer than the threshold

            started = time.monotonic()
            single = await client.get(f"/v1/jobs/{job_id}")
            assert single.status_code == 200 and single.json()["state"] == "running"
            assert time.monotonic() - started < 5, "a plain GET waited behind the streams"
            assert await asyncio.to_thread(_long_idle_transactions, database_url) == []

            await asyncio.to_thread(finish_job, database_url, job_id)
            await asyncio.wait_for(asyncio.gather(*followers), timeout=20)
        finally:
            for task in followers:
                task.cancel()
    for events in seen:
        assert events.count("metric") == METRICS and events.count("log") == LOGS
        assert events[0] == "state" and events[-1] == "end"
