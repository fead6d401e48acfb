"""The jobs list's name filter (`q`, any case, `%` and `_` taken literally) and each listed
job's `progress` (the newest metric's step and epoch), over the real API and Postgres."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.models import Job, JobMetric
from tests.conftest import Stack, insert_job


@pytest.fixture(scope="module")
def keys(stack: Stack) -> tuple[str, str, str]:
    key, owner_id = stack.create_key("list-owner")
    stranger, _ = stack.create_key("list-stranger")
    return key, owner_id, stranger


@pytest.fixture(scope="module")
def job_ids(database_url: str, keys: tuple[str, str, str]) -> Iterator[dict[str, str]]:
    """Four jobs of the owner; "Alpha run" reported metrics up to step 30 in epoch 2."""
    engine = make_sync_engine(database_url)
    ids = {}
    with sync_session_factory(engine)() as session:
        for name in ("Alpha run", "beta_ALPHA", "gamma", "100% alpha"):
            job: Job = insert_job(session, state="running", attempt=1)
            job.owner_id, job.name = keys[1], name
            session.flush()
            ids[name] = job.id
        for step, epoch, metric in [(1, 1.0, "train_loss"), (30, 2.0, "train_loss"),
                                    (20, 2.0, "val_loss"), (10, 1.0, "epoch")]:  # fmt: skip
            session.add(
                JobMetric(job_id=ids["Alpha run"], step=step, epoch=epoch, name=metric, value=0.5)
            )
        session.commit()
        yield ids
    engine.dispose()


def _names(client: httpx.Client, **params: object) -> list[str]:
    response = client.get("/v1/jobs", params=params)
    assert response.status_code == 200, response.text
    return [job["name"] for job in response.json()["data"]]


def test_jobs_are_filtered_by_name_and_carry_their_progress(
    stack: Stack, keys: tuple[str, str, str], job_ids: dict[str, str]
) -> None:
    headers = {"Authorization": f"Bearer {keys[0]}"}
    with httpx.Client(base_url=stack.base_url, headers=headers, timeout=30) as client:
        assert _names(client, q="alpha") == ["100% alpha", "beta_ALPHA", "Alpha run"]
        assert _names(client, q="%") == ["100% alpha"]
        assert _names(client, q="_alpha") == ["beta_ALPHA"]  # not "% alpha"
        assert _names(client, q="ALPHA", limit=1, cursor=job_ids["beta_ALPHA"]) == ["Alpha run"]
        assert _names(client, q="alpha", state="succeeded") == []
        for bad in ("x" * 201, "a\x00"):
            response = client.get("/v1/jobs", params={"q": bad})
            assert response.status_code == 422
            assert response.json()["detail"][0]["loc"] == ["query", "q"]

        listed = {job["name"]: job for job in client.get("/v1/jobs").json()["data"]}
        assert listed["Alpha run"]["progress"] == {"step": 30, "epoch": 2.0}
        assert listed["gamma"]["progress"] is None
        assert "progress" not in client.get(f"/v1/jobs/{job_ids['gamma']}").json()

    stranger = {"Authorization": f"Bearer {keys[2]}"}
    with httpx.Client(base_url=stack.base_url, headers=stranger, timeout=30) as client:
        assert _names(client, q="alpha") == []
