"""An authenticated client of the real stack, and jobs written straight into its database (a
running job nobody runs: neither the worker nor the reconciler touches it while its lease lasts).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from datetime import timedelta

import httpx
import pytest

from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.models import (
    Job,
    JobLog,
    JobMetric,
    JobState,
    StoredDataset,
    StoredModel,
    utcnow,
)
from tests.conftest import Stack


@pytest.fixture(scope="module")
def api_key(stack: Stack) -> tuple[str, str]:
    """(API key, owner id) of an owner of this module's own."""
    return stack.create_key("security-tests")


@pytest.fixture(scope="module")
def client(stack: Stack, api_key: tuple[str, str]) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=stack.base_url, headers={"Authorization": f"Bearer {api_key[0]}"}, timeout=30
    ) as authenticated:
        yield authenticated


def insert_running_job(database_url: str, owner_id: str, *, metrics: int = 0, logs: int = 0) -> str:
    """A running job of ``owner_id`` with a lease an hour long, and its first metrics and logs."""
    engine = make_sync_engine(database_url, pooled=False)
    try:
        with sync_session_factory(engine)() as session:
            common = {"owner_id": owner_id, "name": "x", "filename": "x", "size_bytes": 1,
                      "storage_key": "absent", "sha256": secrets.token_hex(32)}  # fmt: skip
            model = StoredModel(
                kind="file", entry_module=None, factory="build_model", variant="v", **common
            )
            dataset = StoredDataset(kind="file", format="csv", **common)
            session.add_all([model, dataset])
            session.flush()
            job = Job(
                owner_id=owner_id,
                model_id=model.id,
                dataset_id=dataset.id,
                config={},
                model_kwargs={},
                num_processes=1,
                request_hash="h",
                state=JobState.RUNNING,
                attempt=1,
                worker_id="nobody",
                lease_expires_at=utcnow() + timedelta(hours=1),
                heartbeat_at=utcnow(),
                started_at=utcnow(),
            )
            session.add(job)
            session.flush()
            session.add_all(
                JobMetric(job_id=job.id, step=step, name="loss", value=1.0 / (step + 1))
                for step in range(metrics)
            )
            session.add_all(
                JobLog(job_id=job.id, attempt=1, rank=0, stream="stdout", line=f"line {index}")
                for index in range(logs)
            )
            session.commit()
            return job.id
    finally:
        engine.dispose()


def finish_job(database_url: str, job_id: str) -> None:
    engine = make_sync_engine(database_url, pooled=False)
    try:
        with sync_session_factory(engine)() as session:
            job = session.get(Job, job_id)
            assert job is not None
            job.state = JobState.SUCCEEDED
            job.finished_at = utcnow()
            job.lease_expires_at = None
            session.commit()
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def running_job(database_url: str, api_key: tuple[str, str]) -> Iterator[str]:
    """A running job of this module's owner; finished at the end of the module."""
    job_id = insert_running_job(database_url, api_key[1])
    yield job_id
    finish_job(database_url, job_id)
