"""Server-sent events: parsing, and resuming with Last-Event-ID after a dropped connection."""

from __future__ import annotations

import contextlib

import httpx
import pytest

import ace3
from ace3.client._sse import ReconnectingEventStream, ServerSentEvent, SSEDecoder, iter_sse
from tests.unit.sdk.sdk_fakes import (
    DroppingStream,
    MockAPI,
    job_json,
    log,
    metric,
    sse_body,
    sse_response,
)


def parse(text: str) -> list[ServerSentEvent]:
    response = httpx.Response(200, content=text.encode())
    return list(iter_sse(response))


def test_parses_event_id_and_multi_line_data_and_ignores_comments():
    events = parse(
        ": keep-alive\n"
        "event: metric\n"
        "id: 3:0\n"
        "data: first line\n"
        "data:second line\n"
        "\n"
        ": another comment\n"
        "data: plain message\n"
        "retry: 2500\n"
        "unknown: field\n"
        "\n"
    )
    assert events == [
        ServerSentEvent(event="metric", data="first line\nsecond line", id="3:0"),
        ServerSentEvent(event="message", data="plain message", id="3:0", retry=2500),
    ]


def test_crlf_line_endings_and_a_truncated_last_event():
    events = parse('event: log\r\ndata: {"a": 1}\r\n\r\ndata: cut off')
    assert len(events) == 1
    assert events[0].json() == {"a": 1}


def test_comment_only_stream_yields_nothing_and_empty_id_resets():
    decoder = SSEDecoder(last_event_id="1:1")
    for line in [": keep-alive", "", "id:", "data: x"]:
        decoder.decode(line)
    event = decoder.decode("")
    assert event is not None and event.id is None


def test_job_events_are_typed(api: MockAPI):
    api.route(
        "GET",
        "/v1/jobs/job_1/events",
        sse_response(
            [
                ("state", job_json(state="running"), "0:0"),
                ("metric", metric(10, "train_loss", 0.5, epoch=0.5), "1:0"),
                ("log", log(1, "hello"), "1:1"),
                ("end", job_json(state="succeeded"), "1:1"),
            ]
        ),
    )
    events = list(api.client().jobs.events("job_1"))
    assert [event.type for event in events] == ["state", "metric", "log", "end"]
    assert isinstance(events[0].data, ace3.Job) and events[0].data.state == "running"
    assert isinstance(events[1].data, ace3.Metric) and events[1].data.value == 0.5
    assert isinstance(events[2].data, ace3.LogLine) and events[2].data.line == "hello"
    assert events[3].id == "1:1"
    assert api.requests[0].headers["accept"] == "text/event-stream"


def test_reconnects_with_last_event_id_after_a_dropped_connection(api: MockAPI, sleeps):
    first = sse_body(
        [
            ("state", job_json(state="running"), "0:0"),
            ("metric", metric(10, "train_loss", 0.5), "1:0"),
        ]
    )
    api.route(
        "GET",
        "/v1/jobs/job_1/events",
        httpx.Response(200, stream=DroppingStream([first])),
        sse_response(
            [
                ("metric", metric(20, "train_loss", 0.4), "2:0"),
                ("end", job_json(state="succeeded"), "2:0"),
            ]
        ),
    )
    events = list(api.client().jobs.events("job_1"))
    assert [event.data.step for event in events if event.type == "metric"] == [10, 20]
    assert events[-1].type == "end"
    second = api.requests[1]
    assert second.headers["last-event-id"] == "1:0"
    assert second.url.params["metrics_after"] == "1"
    assert second.url.params["logs_after"] == "0"
    assert "last-event-id" not in api.requests[0].headers
    assert len(sleeps) == 1


def test_reconnects_when_the_server_closes_before_end(api: MockAPI, sleeps):
    api.route(
        "GET",
        "/v1/jobs/job_1/events",
        sse_response([("state", job_json(state="running"), "0:0")]),
        httpx.Response(503, headers={"retry-after": "7"}),
        sse_response([("end", job_json(state="failed"), "0:3")]),
    )
    events = list(api.client().jobs.events("job_1"))
    assert [event.type for event in events] == ["state", "end"]
    assert len(api.requests) == 3
    assert sleeps[1] == 7.0  # the busy server's retry-after


def test_gives_up_after_bounded_reconnects(api: MockAPI, sleeps):
    api.route("GET", "/v1/jobs/job_1/events", httpx.ConnectError("refused"))
    with pytest.raises(ace3.APIConnectionError, match="3 reconnect attempts"):
        list(api.client().jobs.events("job_1", max_reconnects=3))
    assert len(api.requests) == 4
    assert len(sleeps) == 3
    assert sleeps[0] <= sleeps[-1] * 4  # growing backoff, bounded


def test_a_client_error_is_not_retried(api: MockAPI):
    api.route("GET", "/v1/jobs/job_1/events", httpx.Response(404, json={"detail": "no job"}))
    with pytest.raises(ace3.NotFoundError):
        list(api.client().jobs.events("job_1"))
    assert len(api.requests) == 1


def test_server_retry_field_sets_the_reconnect_delay(sleeps):
    bodies = [b"retry: 4000\nid: 1\ndata: a\n\n", b"event: end\ndata: b\n\n"]

    @contextlib.contextmanager
    def connect(last_event_id):
        response = httpx.Response(200, content=bodies.pop(0))
        yield response

    stream = ReconnectingEventStream(connect, terminal_events={"end"})
    assert [event.data for event in stream] == ["a", "b"]
    assert 2.0 <= sleeps[0] <= 4.0


def test_deadline_raises_timeout_error():
    @contextlib.contextmanager
    def connect(last_event_id):
        yield httpx.Response(200, content=b": keep-alive\n\n" * 3)

    with pytest.raises(TimeoutError):
        list(ReconnectingEventStream(connect, terminal_events={"end"}, deadline=0.0))
