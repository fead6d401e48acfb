"""GET /v1/queue on the real API over Postgres: the caller's queued jobs in claim order (the fair
queue: priority, then owners take turns) with their global position and why they wait; other
owners' queued jobs are counted, never listed.

The queue is global, so the test has an API and a database of its own: on the session's shared
stack, other tests' jobs entering or leaving the queue between two reads moved every position
(two full-suite runs failed so, one each way)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import delete

from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.models import Job, JobState, Owner, utcnow
from ace3_control.settings import Settings
from tests.conftest import fresh_database, insert_job
from tests.integration.server.in_process_api import add_key, serve


@pytest.fixture(scope="module")
def database_url() -> Iterator[str]:
    with fresh_database() as url:
        yield url


@pytest.fixture(scope="module")
def base_url(
    database_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("queue"), database_url=database_url, broker_url=redis_url
    )
    with serve(settings) as (_app, url):
        yield url


def test_the_queue_lists_only_the_callers_jobs_with_global_positions(
    base_url: str, database_url: str
) -> None:
    engine = make_sync_engine(database_url)
    sessions = sync_session_factory(engine)
    with sessions() as session:
        template = insert_job(session, state=JobState.CANCELLED)
        owner_id, model_id, dataset_id = template.owner_id, template.model_id, template.dataset_id
        other = Owner(name="queue-other")
        session.add(other)
        session.commit()
        other_owner_id = other.id
        key, _ = add_key(session, owner_id)
        other_key, _ = add_key(session, other_owner_id)
    # Too large for any worker (none runs here anyway), low priority: last in line.
    later = utcnow() + timedelta(hours=1)
    ids: list[str] = []
    try:
        with sessions() as session:
            for index, owner in enumerate([owner_id, other_owner_id, owner_id]):
                job = Job(
                    owner_id=owner,
                    name=f"queued-{index}",
                    model_id=model_id,
                    dataset_id=dataset_id,
                    config={"num_gpus": 64},
                    model_kwargs={},
                    num_processes=64,
                    priority="low",
                    request_hash="h",
                    queued_at=later + timedelta(seconds=index),
                    enqueued_at=later + timedelta(seconds=index),
                )
                session.add(job)
                session.flush()
                ids.append(job.id)
            session.commit()

        with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}) as client:
            response = client.get("/v1/queue")
            assert response.status_code == 200, response.text
            body = response.json()
            assert [job["id"] for job in body["data"]] == [ids[0], ids[2]]
            assert [job["name"] for job in body["data"]] == ["queued-0", "queued-2"]
            mine, last = body["data"]
            # The other owner's job (its first) sits between them, taking its turn: counted in
            # positions, never listed.
            assert last["position"] == mine["position"] + 2
            assert (mine["priority"], last["waiting_reason"]) == ("low", "priority")
            assert body["queued"] >= last["position"] >= 3
            assert body["running"] >= 0
            assert set(mine) == {"id", "name", "priority", "position", "waiting_reason",
                                 "num_processes", "created_at", "queued_at",
                                 "enqueued_at"}  # fmt: skip
            job = client.get(f"/v1/jobs/{ids[2]}").json()
            assert (job["priority"], job["queue_position"]) == ("low", last["position"])
            assert job["waiting_reason"] == "priority"
            assert client.get("/v1/queue", params={"limit": 1}).json()["data"] == [mine]
            bad = client.get("/v1/queue", params={"limit": 0})
            assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "limit"]

        with httpx.Client(
            base_url=base_url, headers={"Authorization": f"Bearer {other_key}"}
        ) as client:
            other = client.get("/v1/queue").json()
            assert [job["id"] for job in other["data"]] == [ids[1]]
            assert other["data"][0]["position"] == mine["position"] + 1
        assert httpx.get(f"{base_url}/v1/queue").status_code == 401
    finally:
        with sessions() as session:
            session.execute(delete(Job).where(Job.id.in_(ids)))
            session.commit()
        engine.dispose()
