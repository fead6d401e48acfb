"""A frozen broker freezes no request (issue 30): with the test's own Redis stopped (SIGSTOP,
as in a network partition) for 10 s, job creation and the other routes answer within 2 s,
and after it thaws every job created meanwhile is published and claimed exactly once.

Before the fix each publish ran in the shared threadpool and waited out the freeze: job
creation took as long as the freeze, and once anyio's 40 threads were all held, uploads and
the worker list waited too. The API here is the real app (its reconciler on) over a database
of its own, so that its reconciler touches no other test's jobs; the worker is this test,
claiming each message the way a worker does (the conditional ``queued -> starting``).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from ace3_control import job_transitions
from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.models import Owner
from ace3_control.settings import Settings
from tests.conftest import DigitsFiles, free_port, fresh_database
from tests.integration.server.in_process_api import add_key, serve

FREEZE_SECONDS = 10.0
ANSWER_WITHIN = 2.0
QUEUE = "frozen-broker-test"


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A Redis of this test's own (it is frozen), without persistence."""
    port = free_port()
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no",
         "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
    client.close()
    try:
        yield process, url
    finally:
        os.kill(process.pid, signal.SIGCONT)
        process.kill()
        process.wait(timeout=10)


def _job_id(message: bytes) -> str:
    """The job id a Celery message (protocol 2, JSON) carries: its body is [args, kwargs, ...]."""
    envelope = json.loads(message)
    args = json.loads(base64.b64decode(envelope["body"]))[0]
    return str(args[0])


def test_a_frozen_broker_holds_no_request_and_loses_no_job(
    redis_server: tuple[subprocess.Popen[bytes], str], digits_files: DigitsFiles, tmp_path: Path
) -> None:
    process, broker_url = redis_server
    with fresh_database() as database_url:
        engine = make_sync_engine(database_url)
        sessions = sync_session_factory(engine)
        with sessions() as session:
            owner = Owner(name="frozen-broker")
            session.add(owner)
            session.commit()
            key, _ = add_key(session, owner.id)
        settings = Settings(
            data_dir=tmp_path / "data", database_url=database_url, broker_url=broker_url,
            queue_name=QUEUE, reconcile_interval_seconds=1, republish_after_seconds=3,
            broker_timeout_seconds=0.5,
        )  # fmt: skip
        try:
            with (
                serve(settings, background_loops=True) as (app, base_url),
                httpx.Client(
                    base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=10
                ) as client,
            ):
                _freeze_and_thaw(process, broker_url, app, client, digits_files, sessions)
        finally:
            engine.dispose()


def _freeze_and_thaw(
    process: subprocess.Popen[bytes],
    broker_url: str,
    app: Any,
    client: httpx.Client,
    digits_files: DigitsFiles,
    sessions: Any,
) -> None:
    model = client.post("/v1/models", files={"file": ("model.py", digits_files.model.read_bytes())})
    dataset = client.post(
        "/v1/datasets", files={"file": ("train.npz", digits_files.train.read_bytes())}
    )
    assert model.status_code == 201 and dataset.status_code == 201, (model.text, dataset.text)
    inputs = {"model_id": model.json()["id"], "dataset_id": dataset.json()["id"]}
    before = client.post("/v1/jobs", json={**inputs, "config": {"epochs": 1}})
    assert before.status_code == 201, before.text
    created = [before.json()["id"]]

    def timed(name: str, call: Any) -> tuple[str, float, httpx.Response]:
        started = time.monotonic()
        response = call()
        return name, time.monotonic() - started, response

    def burst(round_: int) -> list[tuple[str, float, httpx.Response]]:
        """Eight job creations and every other kind of route, all at once."""
        calls: list[tuple[str, Any]] = [
            (f"POST /v1/jobs #{i}",
             lambda i=i: client.post("/v1/jobs", json={**inputs, "name": f"r{round_}-{i}",
                                                      "config": {"epochs": 1}}))
            for i in range(8)
        ]  # fmt: skip
        source = f"def build_model():\n    return {round_}\n".encode()
        calls += [
            ("GET /v1/workers", lambda: client.get("/v1/workers")),
            (
                "POST /v1/models",
                lambda: client.post("/v1/models", files={"file": ("m.py", source)}),
            ),
            ("GET /v1/jobs/{id}", lambda: client.get(f"/v1/jobs/{created[0]}")),
            ("GET /v1/jobs", lambda: client.get("/v1/jobs")),
            ("GET /healthz", lambda: client.get("/healthz")),
        ]
        with ThreadPoolExecutor(len(calls)) as pool:
            return list(pool.map(lambda call: timed(*call), calls))

    os.kill(process.pid, signal.SIGSTOP)
    frozen_at = time.monotonic()
    try:
        answers = burst(0)
        time.sleep(3)  # the publishing thread is now stuck on the broker
        answers += burst(1)
        for name, seconds, response in answers:
            assert response.status_code in (200, 201), (name, response.text)
            assert seconds < ANSWER_WITHIN, f"{name} took {seconds:.1f} s with the broker frozen"
        created += [r.json()["id"] for name, _, r in answers if name.startswith("POST /v1/jobs")]
        assert len(set(created)) == 17
        assert app.state.publisher.waiting > 0, "the publishes never met the frozen broker"
        time.sleep(max(0.0, FREEZE_SECONDS - (time.monotonic() - frozen_at)))
    finally:
        os.kill(process.pid, signal.SIGCONT)
    messages, claims = _consume(broker_url, sessions, set(created))
    assert claims == Counter(created), "a job was claimed twice, or never"
    assert set(messages) == set(created)


def _consume(broker_url: str, sessions: Any, jobs: set[str]) -> tuple[Counter[str], Counter[str]]:
    """Be the worker: take every message, claim its job (the conditional update a worker runs),
    until each job was claimed and then a little longer (the reconciler's re-publishes of
    jobs still queued, and copies that reached Redis after their publish timed out, come as
    duplicates, which must find nothing to claim)."""
    broker = redis.Redis.from_url(broker_url)
    messages: Counter[str] = Counter()
    claims: Counter[str] = Counter()
    deadline = time.monotonic() + 20
    quiet_until: float | None = None
    try:
        while quiet_until is None or time.monotonic() < quiet_until:
            assert time.monotonic() < deadline, f"never claimed: {jobs - set(claims)}"
            popped = broker.brpop([QUEUE], timeout=0.5)
            if popped is None:
                continue
            job_id = _job_id(popped[1])
            messages[job_id] += 1
            with sessions() as session:
                claimed = session.execute(job_transitions.claim(job_id, "test-worker", 600)).all()
                session.commit()
            claims[job_id] += len(claimed)
            if quiet_until is None and set(claims) >= jobs:
                quiet_until = time.monotonic() + 2
    finally:
        broker.close()
    return messages, claims
