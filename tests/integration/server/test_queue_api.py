"""GET /v1/queue on the real stack: the caller's queued jobs in claim order (the fair queue:
priority, then owners take turns) with their global position and why they wait; other owners'
queued jobs are counted, never listed."""

from __future__ import annotations

from datetime import timedelta

import httpx
from sqlalchemy import delete

from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.models import Job, JobState, utcnow
from tests.conftest import Stack, insert_job


def test_the_queue_lists_only_the_callers_jobs_with_global_positions(
    stack: Stack, database_url: str
) -> None:
    key, owner_id = stack.create_key("queue-owner")
    other_key, other_owner_id = stack.create_key("queue-other")
    engine = make_sync_engine(database_url)
    sessions = sync_session_factory(engine)
    # Published "in the future": the reconciler never re-publishes them (their enqueued_at is
    # not stale); too large for the stack's worker (8 processes), which never claims them; low
    # priority: last in line.
    later = utcnow() + timedelta(hours=1)
    ids: list[str] = []
    try:
        with sessions() as session:
            template = insert_job(session, state=JobState.CANCELLED)
            for index, owner in enumerate([owner_id, other_owner_id, owner_id]):
                job = Job(
                    owner_id=owner,
                    name=f"queued-{index}",
                    model_id=template.model_id,
                    dataset_id=template.dataset_id,
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

        with httpx.Client(
            base_url=stack.base_url, headers={"Authorization": f"Bearer {key}"}
        ) as client:
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
            # (ids, not positions: another test's job entering the shared stack's queue ahead
            # of these between the two reads moves every position behind it)
            first = client.get("/v1/queue", params={"limit": 1}).json()["data"]
            assert [job["id"] for job in first] == [mine["id"]]
            bad = client.get("/v1/queue", params={"limit": 0})
            assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "limit"]

        with httpx.Client(
            base_url=stack.base_url, headers={"Authorization": f"Bearer {other_key}"}
        ) as client:
            other = client.get("/v1/queue").json()
            assert [job["id"] for job in other["data"]] == [ids[1]]
            assert other["data"][0]["position"] == mine["position"] + 1
        assert httpx.get(f"{stack.base_url}/v1/queue").status_code == 401
    finally:
        with sessions() as session:
            session.execute(delete(Job).where(Job.id.in_(ids)))
            session.commit()
        engine.dispose()
