"""A search's first trial is created the moment the search is, and its next trial the moment a
trial's job ends, not at the driver's next tick (30 s here): on Postgres migration 0015's NOTIFY wakes the driver through the API's
LISTEN connection; on SQLite the driver looks for ended trials itself (one query a tenth of a
second). No worker runs: the test ends the trials' jobs itself, as a worker records them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.models import Job
from ace3_control.settings import Settings
from ace3_server.migrations_check import upgrade
from tests.conftest import fresh_database, insert_job
from tests.integration.server.in_process_api import add_key, serve

TICK_SECONDS = 30.0
PROMPT_SECONDS = 3.0


@pytest.fixture(params=["postgresql", "sqlite"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'ace3.db'}"
        upgrade(url)
        yield url
        return
    with fresh_database() as url:  # (the session stack's trials would wake this driver too)
        yield url


@pytest.fixture
def api(database_url: str, tmp_path: Path) -> Iterator[tuple[str, Any]]:
    """(base URL, session factory) of an API whose driver ticks every 30 s."""
    settings = Settings(
        data_dir=tmp_path,
        database_url=database_url,
        search_tick_seconds=TICK_SECONDS,
        reconcile_interval_seconds=TICK_SECONDS,
    )
    engine = make_sync_engine(database_url)
    with serve(settings, background_loops=True) as (_app, base_url):
        yield base_url, sync_session_factory(engine)
    engine.dispose()


def _trial_jobs(client: httpx.Client, search_id: str) -> list[str]:
    trials = client.get(f"/v1/searches/{search_id}/trials").json()["data"]
    return [trial["job_id"] for trial in sorted(trials, key=lambda t: t["number"])]


def _wait_for_trials(client: httpx.Client, search_id: str, count: int, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while len(_trial_jobs(client, search_id)) < count:
        assert time.monotonic() < deadline, f"no trial {count} after {timeout} s"
        time.sleep(0.05)
    return time.monotonic()


def test_the_next_trial_starts_when_a_trial_ends_not_at_the_next_tick(
    api: tuple[str, Any],
) -> None:
    base_url, sessions = api
    with sessions() as session:
        rows: Job = insert_job(session, state="succeeded")
        key, _ = add_key(session, rows.owner_id)
    body = {
        "model_id": rows.model_id,
        "dataset_id": rows.dataset_id,
        "config": {
            "search_space": {"learning_rate": {"type": "loguniform", "low": 1e-4, "high": 1e-2}},
            "max_trials": 3,
            "objective": "val_accuracy",
            "direction": "maximize",
        },
    }
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}) as client:
        created = client.post("/v1/searches", json=body)
        assert created.status_code in (200, 201), created.text
        search_id = created.json()["id"]
        _wait_for_trials(client, search_id, 1, PROMPT_SECONDS)  # (creating it woke the driver)
        for number in (1, 2):
            job_id = _trial_jobs(client, search_id)[number - 1]
            with sessions() as session:
                job = session.get(Job, job_id)
                job.state, job.final_metrics = "succeeded", {"val_accuracy": 0.5 + number / 10}
                session.commit()
            ended = time.monotonic()
            started = _wait_for_trials(client, search_id, number + 1, PROMPT_SECONDS)
            assert started - ended < PROMPT_SECONDS
        trials = client.get(f"/v1/searches/{search_id}/trials").json()["data"]
        assert sorted(t["state"] for t in trials) == ["running", "succeeded", "succeeded"]
