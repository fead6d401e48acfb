"""A job's typed records (instability, preempted, eval_samples) over the real API and Postgres,
stored the way the worker stores them: listed by type and cursor (pages that may hold
eval_samples short), invisible to another owner, decoded by the SDK, and streamed as ``record``
events whose ids resume without repeating or losing one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import ace3
from ace3.config.events import (
    EVAL_SAMPLES_PAGE,
    EvalSample,
    EvalSamplesRecord,
    InstabilityRecord,
    PreemptedRecord,
)
from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.models import Job
from ace3_worker.ingest import store_typed_record
from tests.conftest import Stack, insert_job

RECORDS = [
    InstabilityRecord(step=4, action="rollback", reason="loss nan", loss=None, grad_norm=2.5,
                      lr_scale=0.5, rolled_back_to_step=2),
    PreemptedRecord(step=6, checkpoint="step-00000006.pt"),
    InstabilityRecord(step=9, action="stop", reason="grad_norm spike", loss=1.0, grad_norm=90.0),
]  # fmt: skip


@pytest.fixture(scope="module")
def keys(stack: Stack) -> tuple[str, str, str]:
    key, owner_id = stack.create_key("records-owner")
    stranger, _ = stack.create_key("records-stranger")
    return key, owner_id, stranger


@pytest.fixture(scope="module")
def job_id(database_url: str, keys: tuple[str, str, str]) -> Iterator[str]:
    """A failed job of the owner with three typed records, written by the worker's own code."""
    engine = make_sync_engine(database_url)
    with sync_session_factory(engine)() as session:
        job: Job = insert_job(session, state="failed", attempt=1)
        job.owner_id = keys[1]
        for record in RECORDS:
            store_typed_record(session, job.id, 1, record)
            session.flush()  # (ids in the records' order)
        session.commit()
        yield job.id
    engine.dispose()


def _http(stack: Stack, key: str) -> httpx.Client:
    return httpx.Client(base_url=stack.base_url, headers={"Authorization": f"Bearer {key}"})


def test_records_are_listed_by_type_and_cursor_and_only_to_their_owner(
    stack: Stack, keys: tuple[str, str, str], job_id: str
) -> None:
    with _http(stack, keys[0]) as owner, _http(stack, keys[2]) as stranger:
        listed = owner.get(f"/v1/jobs/{job_id}/records").json()
        assert [(item["type"], item["step"]) for item in listed["data"]] == [
            ("instability", 4), ("preempted", 6), ("instability", 9)
        ]  # fmt: skip
        assert listed["data"][0]["record"] == RECORDS[0].model_dump(mode="json")
        first = listed["data"][0]["id"]
        page = owner.get(f"/v1/jobs/{job_id}/records", params={"after": first, "limit": 1}).json()
        assert [item["step"] for item in page["data"]] == [6]
        assert page["next_after"] == listed["data"][1]["id"]
        only = owner.get(f"/v1/jobs/{job_id}/records", params={"type": "preempted"}).json()
        assert [item["step"] for item in only["data"]] == [6]
        bad = owner.get(f"/v1/jobs/{job_id}/records", params={"type": "metrics"})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "type"]
        assert stranger.get(f"/v1/jobs/{job_id}/records").status_code == 404
        assert stranger.get(f"/v1/jobs/{job_id}/events").status_code == 404


def test_the_sdk_decodes_records_and_the_stream_resumes_after_the_last_one(
    stack: Stack, keys: tuple[str, str, str], job_id: str
) -> None:
    with ace3.Client(api_key=keys[0], base_url=stack.base_url) as client:
        records = client.jobs.records(job_id)
        assert [item.record for item in records] == RECORDS
        assert client.job(job_id).instabilities() == [RECORDS[0], RECORDS[2]]
        events = [event for event in client.jobs.events(job_id, timeout=30)]
        streamed = [event for event in events if event.type == "record"]
        assert [event.data.record for event in streamed] == RECORDS
        assert all(isinstance(event.data, ace3.JobRecord) for event in streamed)
        # Resumed after the first record (its id carries the records' cursor): the rest only.
        resumed = client.jobs.events(job_id, last_event_id=streamed[0].id, timeout=30)
        again: list[Any] = [event.data.record for event in resumed if event.type == "record"]
        assert again == RECORDS[1:]
        # An id of two numbers (an older stream's, before any record) resumes from the first.
        metrics_and_logs = streamed[0].id.rsplit(":", 1)[0]
        old = client.jobs.events(job_id, last_event_id=metrics_and_logs, timeout=30)
        assert [event.data.record for event in old if event.type == "record"] == RECORDS


def _samples(step: int) -> EvalSamplesRecord:
    sample = EvalSample(prompt="2 + 2 =", completion=f" {step}", completion_tokens=1)
    return EvalSamplesRecord(step=step, max_new_tokens=4, samples=[sample])


def test_pages_that_may_hold_eval_samples_are_short_and_the_sdk_reads_them_all(
    stack: Stack, database_url: str, keys: tuple[str, str, str]
) -> None:
    """An eval_samples record may be 256 KiB: a page that may hold them holds at most
    EVAL_SAMPLES_PAGE, whatever ``limit`` asks; the SDK pages through all of them, and the
    event stream sends them all, a short read at a time."""
    count = EVAL_SAMPLES_PAGE + 3
    engine = make_sync_engine(database_url)
    with sync_session_factory(engine)() as session:
        job: Job = insert_job(session, state="succeeded", attempt=1)
        job.owner_id = keys[1]
        store_typed_record(session, job.id, 1, PreemptedRecord(step=0, checkpoint=None))
        for step in range(1, count + 1):
            store_typed_record(session, job.id, 1, _samples(step))
            session.flush()
        session.commit()
        job_id = job.id
    engine.dispose()
    with _http(stack, keys[0]) as owner:
        path = f"/v1/jobs/{job_id}/records"
        page = owner.get(path, params={"type": "eval_samples", "limit": 1000}).json()["data"]
        assert [item["step"] for item in page] == list(range(1, EVAL_SAMPLES_PAGE + 1))
        assert len(owner.get(path, params={"limit": 1000}).json()["data"]) == EVAL_SAMPLES_PAGE
        newest = owner.get(path, params={"type": "eval_samples", "order": "newest", "limit": 1})
        assert [item["step"] for item in newest.json()["data"]] == [count]
        others = owner.get(path, params={"type": "preempted", "limit": 1000}).json()["data"]
        assert [item["step"] for item in others] == [0]
    with ace3.Client(api_key=keys[0], base_url=stack.base_url) as client:
        assert [record.step for record in client.job(job_id).eval_samples()] == list(
            range(1, count + 1)
        )
        assert len(client.jobs.records(job_id)) == count + 1
        streamed = [e for e in client.jobs.events(job_id, timeout=30) if e.type == "record"]
        assert [event.data.record.step for event in streamed] == list(range(count + 1))
