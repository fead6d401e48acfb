"""Pushed streams over the real API and Postgres: with the safety poll at 30 s, a metric the
worker's code inserts, and a job's end, reach a following client in well under a second (the
NOTIFY of migration 0013 woke the stream); after the listener's connection is killed it
reconnects and wakes the streams again; with ACE3_STREAM_WAKE=poll they poll as before."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest

from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.models import Job
from ace3_control.settings import Settings
from ace3_server.services.stream_listener import LISTENER_APPLICATION_NAME
from ace3_worker.reports import store_metrics
from tests.conftest import fresh_database, insert_job
from tests.integration.server.in_process_api import add_key, serve

SAFETY_POLL_SECONDS = 30.0
PROMPT_SECONDS = 1.0


@pytest.fixture(scope="module")
def database_url() -> Iterator[str]:
    """A database of this module's own: the session's stack (its API's listener, its worker's
    heartbeats, other tests' jobs) would send notifications and hold listeners these tests count."""
    with fresh_database() as url:
        yield url


@pytest.fixture(scope="module")
def api(
    database_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """An API process of its own whose streams re-read only every 30 s unless notified."""
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("notify"),
        database_url=database_url,
        broker_url=redis_url,
        stream_wake="notify",
        stream_safety_poll_seconds=SAFETY_POLL_SECONDS,
    )
    with serve(settings) as (app, base_url):
        app.state.base_url = base_url
        yield app


@pytest.fixture(scope="module")
def session_factory(database_url: str) -> Iterator[Any]:
    engine = make_sync_engine(database_url)
    yield sync_session_factory(engine)
    engine.dispose()


@pytest.fixture()
def job_and_key(session_factory: Any) -> tuple[str, str]:
    with session_factory() as session:
        job: Job = insert_job(session, state="running", attempt=1)
        return job.id, add_key(session, job.owner_id)[0]


class Follower:
    """A client reading a job's events in a thread: (arrival time, event, data) per event."""

    def __init__(self, base_url: str, key: str, job_id: str) -> None:
        self.events: queue.Queue[tuple[float, str, str]] = queue.Queue()
        self._client = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"})
        self._thread = threading.Thread(target=self._read, args=(job_id,), daemon=True)
        self._thread.start()

    def _read(self, job_id: str) -> None:
        try:
            with self._client.stream("GET", f"/v1/jobs/{job_id}/events", timeout=60) as response:
                name = ""
                for line in response.iter_lines():
                    if line.startswith("event: "):
                        name = line[len("event: ") :]
                    elif line.startswith("data: "):
                        self.events.put((time.monotonic(), name, line[len("data: ") :]))
        except httpx.HTTPError:  # (closed by the test)
            pass

    def next(self, event: str, timeout: float) -> float:
        """When the next ``event`` arrived (events before it are skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            arrived, name, _data = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
            if name == event:
                return arrived

    def close(self) -> None:
        self._client.close()


def _insert_metric(session_factory: Any, job_id: str, step: int) -> float:
    from ace3.config.events import MetricsRecord

    with session_factory() as session:
        store_metrics(session, job_id, MetricsRecord(step=step, values={"loss": 1.0 / step}))
        session.commit()
    return time.monotonic()


def _finish(session_factory: Any, job_id: str) -> float:
    with session_factory() as session:
        session.get(Job, job_id).state = "succeeded"
        session.commit()
    return time.monotonic()


def test_an_insert_and_the_end_wake_the_stream_long_before_the_safety_poll(
    api: Any, session_factory: Any, job_and_key: tuple[str, str]
) -> None:
    job_id, key = job_and_key
    followers = [Follower(api.state.base_url, key, job_id) for _ in range(3)]
    try:
        for follower in followers:
            follower.next("state", timeout=10)
        time.sleep(0.3)  # (the streams now wait: their first read is done)
        for step in (1, 2, 3):
            inserted = _insert_metric(session_factory, job_id, step)
            for follower in followers:
                assert follower.next("metric", timeout=5) - inserted < PROMPT_SECONDS
        finished = _finish(session_factory, job_id)
        for follower in followers:
            assert follower.next("end", timeout=5) - finished < PROMPT_SECONDS
    finally:
        for follower in followers:
            follower.close()


def test_the_listener_reconnects_after_its_connection_is_killed(
    api: Any, database_url: str, session_factory: Any, job_and_key: tuple[str, str]
) -> None:
    job_id, key = job_and_key
    hub = api.state.stream_wakes.hub
    connects = hub.connects
    with psycopg.connect(database_url, autocommit=True) as admin:
        killed = admin.execute(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s) AS killed",
            (LISTENER_APPLICATION_NAME,),
        ).fetchone()
    assert killed == (1,)  # (this module's database: only this test's API listens on it)
    deadline = time.monotonic() + 10
    while hub.connects == connects:
        assert time.monotonic() < deadline, "the listener did not reconnect"
        time.sleep(0.05)
    follower = Follower(api.state.base_url, key, job_id)
    try:
        follower.next("state", timeout=10)
        time.sleep(0.3)
        inserted = _insert_metric(session_factory, job_id, 1)
        assert follower.next("metric", timeout=5) - inserted < PROMPT_SECONDS
    finally:
        follower.close()


def test_the_migration_notifies_only_for_streamed_changes(
    database_url: str, session_factory: Any, job_and_key: tuple[str, str]
) -> None:
    job_id, _key = job_and_key
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN ace3_stream")
        with session_factory() as session:  # (a heartbeat: not a streamed change)
            session.get(Job, job_id).heartbeat_at = session.get(Job, job_id).created_at
            session.commit()
        assert [n.payload for n in listener.notifies(timeout=0.3)] == []
        _insert_metric(session_factory, job_id, 7)
        assert [n.payload for n in listener.notifies(timeout=0.5, stop_after=1)] == [job_id]
        for phase, environment in (("preparing_environment", None), (None, "e" * 64)):
            with session_factory() as session:  # (revision 0019: the state event carries both)
                job = session.get(Job, job_id)
                job.phase, job.environment_hash = phase, environment
                session.commit()
            assert [n.payload for n in listener.notifies(timeout=0.5, stop_after=1)] == [job_id]


def test_with_stream_wake_poll_the_streams_poll_as_before(
    database_url: str,
    redis_url: str,
    tmp_path: Any,
    session_factory: Any,
    job_and_key: tuple[str, str],
) -> None:
    job_id, key = job_and_key
    settings = Settings(
        data_dir=tmp_path, database_url=database_url, broker_url=redis_url, stream_wake="poll"
    )
    with serve(settings) as (app, base_url):
        assert app.state.stream_wakes.hub is None
        follower = Follower(base_url, key, job_id)
        try:
            follower.next("state", timeout=10)
            inserted = _insert_metric(session_factory, job_id, 1)
            assert follower.next("metric", timeout=5) - inserted < PROMPT_SECONDS
            finished = _finish(session_factory, job_id)
            assert follower.next("end", timeout=5) - finished < PROMPT_SECONDS
        finally:
            follower.close()
