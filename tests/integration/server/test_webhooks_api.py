"""Webhooks on the real stack: a local receiver (http.server in a thread) gets a job's state
changes in order, each signed (checked with ace3.webhooks.verify_signature); a receiver that
fails twice gets the third attempt and the delivery log shows all three; the secret is shown
once; another owner gets 404; bad URLs and unknown events are 422 naming the field."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import ace3
from ace3.webhooks import verify_signature
from ace3_control import job_transitions
from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.models import Job, JobState, Search
from tests.conftest import DigitsFiles, Stack


@dataclass
class Receiver:
    url: str
    fail_first: int = 0
    requests: list[tuple[dict[str, str], bytes]] = field(default_factory=list)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            headers = {name.lower(): value for name, value in self.headers.items()}
            state.requests.append((headers, body))
            failing = len(state.requests) <= state.fail_first
            self.send_response(503 if failing else 204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_port}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def owner(stack: Stack) -> tuple[str, str]:
    return stack.create_key("webhooks-owner")


@pytest.fixture(scope="module")
def owner_id(owner: tuple[str, str]) -> str:
    return owner[1]


@pytest.fixture(scope="module")
def clients(stack: Stack, owner: tuple[str, str]) -> Iterator[tuple[ace3.Client, ace3.Client]]:
    key, _ = owner
    other, _ = stack.create_key("webhooks-stranger")
    with (
        ace3.Client(api_key=key, base_url=stack.base_url) as owner,
        ace3.Client(api_key=other, base_url=stack.base_url) as stranger,
    ):
        yield owner, stranger


def wait_until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_a_jobs_state_changes_arrive_in_order_and_signed(
    clients: tuple[ace3.Client, ace3.Client],
    owner_id: str,
    receiver: Receiver,
    digits_files: DigitsFiles,
    database_url: str,
) -> None:
    """The job is moved through its states by the statements the worker runs (claim, running,
    finish), each in its own transaction, so the test takes a second rather than a training
    run; the triggers, the outbox and the API's delivery loop are the real ones."""
    client, _ = clients
    hook = client.webhooks.create(receiver.url, ["job.*"])
    assert hook.secret and hook.secret.startswith("whsec_")
    engine = make_sync_engine(database_url)
    try:
        model = client.load_model(digits_files.model)
        train = client.load_dataset(digits_files.train)
        with sync_session_factory(engine)() as session:
            job = Job(owner_id=owner_id, model_id=model.id, dataset_id=train.id, name="hooked",
                      config={}, model_kwargs={}, num_processes=1, request_hash="h")  # fmt: skip
            session.add(job)
            session.commit()
            attempt = session.execute(job_transitions.claim(job.id, "test-worker", 30)).scalar()
            session.commit()
            assert attempt == 1
            for stmt in (
                job_transitions.mark_running(job.id, attempt),
                job_transitions.finish(
                    job.id, attempt, JobState.SUCCEEDED, exit_code=0, final_metrics={"loss": 0.5}
                ),
            ):
                assert session.execute(stmt).rowcount == 1
                session.commit()

        wait_until(lambda: len(receiver.requests) >= 4, 20, "the job's four events")
        events = [
            verify_signature(hook.secret, body, headers.get("ace3-signature"))
            for headers, body in receiver.requests
        ]
        assert all(headers["ace3-webhook-id"] == hook.id for headers, _ in receiver.requests)
        assert [h["ace3-delivery-id"] for h, _ in receiver.requests] == [e["id"] for e in events]
        assert all(h["content-type"] == "application/json" for h, _ in receiver.requests)
        assert [event["type"] for event in events] == [
            "job.queued", "job.starting", "job.running", "job.succeeded"
        ]  # fmt: skip
        jobs = [event["data"]["job"] for event in events]
        assert {item["id"] for item in jobs} == {job.id} and jobs[0]["name"] == "hooked"
        assert [item["previous_state"] for item in jobs] == [None, "queued", "starting", "running"]
        assert jobs[-1]["final_metrics"] == {"loss": 0.5} and jobs[-1]["exit_code"] == 0
        assert len({event["id"] for event in events}) == 4
        # The receiver answers before the sender records the answer: the last row may still be
        # pending for a moment after its request arrived.
        wait_until(
            lambda: all(d.state == "delivered" for d in client.webhooks.deliveries(hook.id).data),
            20,
            "the four deliveries recorded as delivered",
        )
        log = client.webhooks.deliveries(hook.id).data
        assert [d.id for d in log] == [e["id"] for e in reversed(events)]  # newest first
        assert all(d.state == "delivered" and d.attempts == 1 for d in log)
        page = client.webhooks.deliveries(hook.id, limit=3)
        assert len(page.data) == 3 and len(list(page)) == 4
    finally:
        client.webhooks.delete(hook.id)
        engine.dispose()


def test_only_the_subscribed_search_events_are_delivered(
    clients: tuple[ace3.Client, ace3.Client],
    owner_id: str,
    receiver: Receiver,
    digits_files: DigitsFiles,
    database_url: str,
) -> None:
    client, _ = clients
    hook = client.webhooks.create(receiver.url, ["search.succeeded"])
    engine = make_sync_engine(database_url)
    try:
        model = client.load_model(digits_files.model)
        train = client.load_dataset(digits_files.train)
        with sync_session_factory(engine)() as session:
            search = Search(owner_id=owner_id, model_id=model.id, dataset_id=train.id,
                            name="swept", config={}, model_kwargs={}, request_hash="h",
                            state="succeeded")  # fmt: skip
            search.state = "queued"
            session.add(search)
            session.commit()
            for state in ("running", "succeeded"):
                search.state = state
                session.commit()
        wait_until(lambda: receiver.requests, 20, "the search's event")
        time.sleep(0.5)  # (nothing else may follow)
        assert len(receiver.requests) == 1
        headers, body = receiver.requests[0]
        event = verify_signature(hook.secret or "", body, headers["ace3-signature"])
        assert event["type"] == "search.succeeded"
        assert event["data"]["search"] == {"id": search.id, "name": "swept", "state": "succeeded",
                                           "previous_state": "running", "error": None}  # fmt: skip
    finally:
        client.webhooks.delete(hook.id)
        engine.dispose()


def test_a_failing_receiver_is_retried_and_every_attempt_is_logged(
    clients: tuple[ace3.Client, ace3.Client], receiver: Receiver
) -> None:
    client, _ = clients
    receiver.fail_first = 2
    hook = client.webhooks.create(receiver.url, ["search.*"])
    try:
        queued = client.webhooks.test(hook.id)
        assert queued.event_type == "ping" and queued.state == "pending"
        with pytest.raises(ace3.ConflictError, match="still pending"):
            client.webhooks.test(hook.id)  # one ping at a time

        def delivered() -> ace3.client.webhooks.WebhookDelivery | None:
            log = client.webhooks.deliveries(hook.id).data
            return log[0] if log and log[0].state == "delivered" else None

        wait_until(delivered, 20, "the ping delivered on its third attempt")
        delivery = delivered()
        assert delivery is not None and delivery.id == queued.id
        assert delivery.attempts == 3 and delivery.last_status_code == 204
        assert [a.status_code for a in delivery.history] == [503, 503, 204]
        assert [a.error for a in delivery.history] == ["HTTP 503", "HTTP 503", None]
        assert all(a.duration_ms is not None for a in delivery.history)
        bodies = [
            verify_signature(hook.secret or "", body, h["ace3-signature"])
            for h, body in receiver.requests
        ]
        assert len(bodies) == 3 and {body["id"] for body in bodies} == {queued.id}
        assert bodies[0]["type"] == "ping" and bodies[0]["data"] == {"webhook_id": hook.id}
    finally:
        client.webhooks.delete(hook.id)


def test_the_secret_is_shown_once_and_other_owners_get_404(
    clients: tuple[ace3.Client, ace3.Client],
) -> None:
    client, stranger = clients
    hook = client.webhooks.create("http://127.0.0.1:9/hook", ["job.failed", "job.failed"])
    assert hook.secret and hook.events == ["job.failed"]
    again = client.webhooks.get(hook.id)
    assert again.secret is None and "secret" not in again.model_dump(exclude_none=True)
    listed = [item for item in client.webhooks.list() if item.id == hook.id]
    assert len(listed) == 1 and listed[0].secret is None
    for call in (
        lambda: stranger.webhooks.get(hook.id),
        lambda: stranger.webhooks.deliveries(hook.id),
        lambda: stranger.webhooks.test(hook.id),
        lambda: stranger.webhooks.delete(hook.id),
    ):
        with pytest.raises(ace3.NotFoundError):
            call()
    assert hook.id not in {item.id for item in stranger.webhooks.list()}
    client.webhooks.delete(hook.id)
    with pytest.raises(ace3.NotFoundError):
        client.webhooks.get(hook.id)


@pytest.mark.parametrize(
    ("url", "events", "field", "message"),
    [
        ("ftp://example.com/hook", ["job.failed"], "url", "http or https"),
        ("https://me:pw@example.com/hook", ["job.failed"], "url", "credentials"),
        ("http://127.0.0.1/hook", ["job.exploded", "job.*"], "events", "['job.exploded']"),
        ("http://127.0.0.1/hook", [], "events", "at least 1"),
    ],
)
def test_bad_urls_and_unknown_events_are_422_naming_the_field(
    clients: tuple[ace3.Client, ace3.Client], url: str, events: list[str], field: str, message: str
) -> None:
    client, _ = clients
    with pytest.raises(ace3.ValidationError) as caught:
        client.webhooks.create(url, events)
    assert caught.value.errors[0]["loc"] == ["body", field]
    assert message in caught.value.errors[0]["msg"]
