"""Capacity on the real stack: the test worker (CPU, ACE3_WORKER_CPU_PROCESSES=8, 2 slots)
registers itself, jobs and searches it can never run are refused with 422 naming the field, and
a job it cannot fit that got past admission is handed back (never claimed), then failed by the
reconciler once it waited too long."""

from __future__ import annotations

import importlib.metadata
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import update

import ace3
from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.models import Job, utcnow
from ace3_control.queue import JobPublisher
from ace3_control.settings import Settings
from tests.conftest import DigitsFiles, Stack, insert_job


@pytest.fixture(scope="module")
def owner(stack: Stack) -> Iterator[httpx.Client]:
    key, _ = stack.create_key("capacity-owner")
    with httpx.Client(
        base_url=stack.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as client:
        yield client


@pytest.fixture(scope="module")
def workers(owner: httpx.Client) -> list[dict[str, Any]]:
    """The live workers, once the test worker registered (it starts beside the API)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        response = owner.get("/v1/workers")
        assert response.status_code == 200, response.text
        if response.json()["data"]:
            return response.json()["data"]
        time.sleep(0.3)
    raise AssertionError("the test worker never registered")


@pytest.fixture(scope="module")
def uploaded(owner: httpx.Client, digits_files: DigitsFiles) -> dict[str, str]:
    model = owner.post("/v1/models", files={"file": ("model.py", digits_files.model.read_bytes())})
    dataset = owner.post(
        "/v1/datasets", files={"file": ("train.npz", digits_files.train.read_bytes())}
    )
    return {"model_id": model.json()["id"], "dataset_id": dataset.json()["id"]}


def test_the_worker_lists_itself_with_its_capacity(
    stack: Stack, workers: list[dict[str, Any]]
) -> None:
    [worker] = [w for w in workers if w["queue"] == stack.env["ACE3_QUEUE_NAME"]]
    assert (worker["device_kind"], worker["device_count"], worker["slots"]) == ("cpu", 8, 2)
    assert set(worker) == {"id", "hostname", "device_kind", "device_count", "slots", "queue",
                           "started_at", "last_seen_at"}  # fmt: skip
    assert httpx.get(f"{stack.base_url}/v1/workers").status_code == 401


def test_the_sdk_lists_the_workers(stack: Stack, workers: list[dict[str, Any]]) -> None:
    key, _ = stack.create_key("capacity-sdk")
    with ace3.Client(api_key=key, base_url=stack.base_url) as client:
        listed = client.workers.list()
    assert [w.id for w in listed] == [w["id"] for w in workers]
    assert listed[0].fits(8) and not listed[0].fits(9) and not listed[0].fits(1, "nccl")


def test_more_processes_than_any_worker_has_is_refused_on_num_gpus(
    owner: httpx.Client, uploaded: dict[str, str], workers: list[dict[str, Any]]
) -> None:
    before = owner.get("/v1/jobs").json()["data"]
    response = owner.post(
        "/v1/jobs", json={**uploaded, "config": {"num_gpus": 16, "batch_size": 32}}
    )
    assert response.status_code == 422, response.text
    [problem] = response.json()["detail"]
    assert problem["loc"] == ["body", "config", "num_gpus"]
    assert "the largest live worker has 8 CPU processes" in problem["msg"]
    assert owner.get("/v1/jobs").json()["data"] == before, "nothing was queued"


def test_nccl_without_a_cuda_worker_is_refused_on_backend(
    owner: httpx.Client, uploaded: dict[str, str], workers: list[dict[str, Any]]
) -> None:
    response = owner.post("/v1/jobs", json={**uploaded, "config": {"backend": "nccl"}})
    assert response.status_code == 422, response.text
    [problem] = response.json()["detail"]
    assert problem["loc"] == ["body", "config", "backend"]
    assert "backend='nccl' needs a CUDA worker" in problem["msg"]


def test_a_requirement_that_would_replace_the_workers_torch_is_refused(
    owner: httpx.Client, uploaded: dict[str, str], workers: list[dict[str, Any]]
) -> None:
    """The worker advertises its installed packages when it registers (workers.packages): an
    environment only adds packages, so asking for another torch is refused at submission."""
    installed = importlib.metadata.version("torch")  # (the worker runs this venv's Python)
    response = owner.post(
        "/v1/jobs", json={**uploaded, "config": {"requirements": ["einops", "torch==0.0.1"]}}
    )
    assert response.status_code == 422, response.text
    [problem] = response.json()["detail"]
    assert problem["loc"] == ["body", "config", "requirements", 1]
    assert "'torch==0.0.1'" in problem["msg"] and installed in problem["msg"]
    assert "never replaces the worker's torch" in problem["msg"]


def test_a_search_whose_base_config_no_worker_can_run_is_refused(
    owner: httpx.Client, uploaded: dict[str, str], workers: list[dict[str, Any]]
) -> None:
    config = {
        "search_space": {"learning_rate": {"type": "loguniform", "low": 1e-4, "high": 1e-2}},
        "max_trials": 2,
        "base_config": {"num_gpus": 16, "batch_size": 32},
    }
    response = owner.post("/v1/searches", json={**uploaded, "config": config})
    assert response.status_code == 422, response.text
    assert [p["loc"] for p in response.json()["detail"]] == [
        ["body", "config", "base_config", "num_gpus"]
    ]


def test_a_job_past_admission_that_does_not_fit_is_handed_back_then_failed(
    stack: Stack, database_url: str, workers: list[dict[str, Any]]
) -> None:
    """As if admitted before any worker registered: the worker must not run 16 processes'
    work with 8, nor fail it; the reconciler fails it once it waited too long."""
    engine = make_sync_engine(database_url)
    sessions = sync_session_factory(engine)
    try:
        with sessions() as session:
            job = insert_job(session, num_processes=16, config={"num_gpus": 16, "backend": "auto"})
        settings = Settings(
            broker_url=stack.env["ACE3_BROKER_URL"], queue_name=stack.env["ACE3_QUEUE_NAME"]
        )
        publisher = JobPublisher(settings)
        publisher.publish(job.id)
        publisher.close()
        deadline = time.monotonic() + 30
        while "does not fit this worker" not in stack.log_tail("worker", 400):
            assert time.monotonic() < deadline, stack.log_tail("worker")
            time.sleep(0.3)
        with sessions() as session:
            row = session.get(Job, job.id)
            assert row is not None and (row.state, row.attempt) == ("queued", 0)
            session.execute(
                update(Job).where(Job.id == job.id).values(queued_at=utcnow() - timedelta(hours=1))
            )
            session.commit()
        deadline = time.monotonic() + 30
        while True:
            with sessions() as session:
                row = session.get(Job, job.id)
                assert row is not None
                if row.state != "queued":
                    break
            assert time.monotonic() < deadline, "the reconciler never failed the job"
            time.sleep(0.3)
        assert (row.state, row.attempt) == ("failed", 0)
        assert "no live worker can run this job" in (row.error or "")
        assert "the largest live worker has 8 CPU processes" in (row.error or "")
    finally:
        engine.dispose()
