"""Server-sent events: a line parser over an httpx streaming response, and an iterator that
reconnects after a dropped connection, resuming with ``Last-Event-ID``.

Follows the WHATWG event-stream format: ``event``, ``data`` (several lines joined with
``\\n``), ``id``, ``retry``; lines starting with ``:`` are comments (keep-alives) and ignored.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import BaseModel

from ace3.client._http import MAX_RETRY_AFTER, parse_retry_after, should_retry_status
from ace3.errors import APIConnectionError, APIStatusError

DEFAULT_MAX_RECONNECTS = 5
RECONNECT_INITIAL_DELAY = 0.5
RECONNECT_MAX_DELAY = 10.0


def _sleep(seconds: float) -> None:  # one place for tests to patch
    time.sleep(seconds)


@dataclass(frozen=True)
class ServerSentEvent:
    """One dispatched event."""

    event: str = "message"
    data: str = ""
    id: str | None = None
    retry: int | None = None

    def json(self) -> Any:
        return json.loads(self.data)


class SSEDecoder:
    """Feed it lines (without their line ending); it returns an event at each blank line.

    ``last_event_id`` persists across events, as the spec says; ``retry`` holds the latest
    reconnection delay (milliseconds) the server asked for.
    """

    def __init__(self, last_event_id: str | None = None) -> None:
        self._event = ""
        self._data: list[str] = []
        self._block_retry: int | None = None
        self.last_event_id = last_event_id
        self.retry: int | None = None

    def decode(self, line: str) -> ServerSentEvent | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None  # a comment, e.g. ": keep-alive"
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "event":
            self._event = value
        elif field == "data":
            self._data.append(value)
        elif field == "id":
            if "\0" not in value:
                self.last_event_id = value or None
        elif field == "retry" and value.isdigit():
            self.retry = self._block_retry = int(value)
        return None  # any other field is ignored

    def _dispatch(self) -> ServerSentEvent | None:
        event = None
        if self._data or self._event:
            event = ServerSentEvent(
                event=self._event or "message",
                data="\n".join(self._data),
                id=self.last_event_id,
                retry=self._block_retry,
            )
        self._event = ""
        self._data = []
        self._block_retry = None
        return event


def iter_sse(response: httpx.Response) -> Iterator[ServerSentEvent]:
    """Every event of one streaming response, until the server closes it. An event cut off
    by the end of the stream (no blank line after it) is discarded, as the spec says."""
    decoder = SSEDecoder()
    for line in response.iter_lines():
        event = decoder.decode(line)
        if event is not None:
            yield event


Connect = Callable[[str | None], AbstractContextManager[httpx.Response]]


class ReconnectingEventStream:
    """Iterate events across reconnections.

    ``connect(last_event_id)`` opens the stream (a context manager yielding a streaming
    response), sending ``Last-Event-ID`` when it is not None. When the connection drops, or
    the server closes it before one of ``terminal_events`` arrived, it reconnects after a
    backoff (the server's ``retry:`` field sets the base delay), at most ``max_reconnects``
    times in a row; receiving an event resets the count. After that it raises
    :class:`~ace3.errors.APIConnectionError`. ``deadline`` (a ``time.monotonic()`` value)
    raises ``TimeoutError`` once passed, checked on every line, keep-alives included.
    """

    def __init__(
        self,
        connect: Connect,
        *,
        terminal_events: Collection[str] = (),
        max_reconnects: int = DEFAULT_MAX_RECONNECTS,
        last_event_id: str | None = None,
        deadline: float | None = None,
    ):
        self._connect = connect
        self._terminal_events = frozenset(terminal_events)
        self.max_reconnects = max_reconnects
        self.last_event_id = last_event_id
        self.deadline = deadline
        self.reconnects = 0  # total, for diagnostics
        self._retry_ms: int | None = None
        self._done = False

    def __iter__(self) -> Iterator[ServerSentEvent]:
        failures = 0
        while not self._done:
            error: BaseException | None = None
            try:
                with self._connect(self.last_event_id) as response:
                    decoder = SSEDecoder(self.last_event_id)
                    for line in response.iter_lines():
                        self._check_deadline()
                        event = decoder.decode(line)
                        if decoder.retry is not None:
                            self._retry_ms = decoder.retry
                        if event is None:
                            continue
                        failures = 0
                        self.last_event_id = event.id
                        if event.event in self._terminal_events:
                            self._done = True
                        yield event
                        if self._done:
                            return
                if not self._terminal_events:
                    return  # a clean close is the end when no terminal event is expected
                error = APIConnectionError("the server closed the event stream early")
            except (httpx.TransportError, APIConnectionError) as exc:
                error = exc
            except APIStatusError as exc:
                if not should_retry_status(exc.status_code):
                    raise
                error = exc
            self._check_deadline()
            failures += 1
            if failures > self.max_reconnects:
                raise APIConnectionError(
                    f"lost the event stream and could not resume it after "
                    f"{self.max_reconnects} reconnect attempts (last event id "
                    f"{self.last_event_id!r}): {error}"
                ) from error
            self.reconnects += 1
            delay = self._backoff(failures)
            refusal = getattr(error, "response", None)
            if refusal is not None:  # a busy server's retry-after wins when longer
                retry_after = parse_retry_after(refusal.headers)
                if retry_after is not None:
                    delay = max(delay, min(retry_after, MAX_RETRY_AFTER))
            _sleep(delay)

    def _backoff(self, failures: int) -> float:
        """Exponential from the base delay (the server's ``retry:`` or 0.5 s), jittered
        within its upper half so reconnecting clients spread out but never spin."""
        base = self._retry_ms / 1000.0 if self._retry_ms is not None else RECONNECT_INITIAL_DELAY
        ceiling = min(RECONNECT_MAX_DELAY, base * (2 ** (failures - 1)))
        return random.uniform(ceiling / 2, ceiling)

    def _check_deadline(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise TimeoutError("timed out waiting on the event stream")


def follow_events(
    http: Any,
    path: str,
    *,
    params: dict[str, Any] | None = None,
    resume_params: Callable[[str], dict[str, Any]] | None = None,
    max_reconnects: int = 5,
    last_event_id: str | None = None,
    timeout: float | None = None,
) -> Iterator[ServerSentEvent]:
    """Follow ``GET path`` as server-sent events until its ``end`` event, reconnecting with
    ``Last-Event-ID`` (and the query ``resume_params`` derives from it) when the connection
    drops. ``timeout`` (seconds) bounds the whole wait and raises ``TimeoutError``."""

    @contextlib.contextmanager
    def connect(resume_id: str | None) -> Iterator[httpx.Response]:
        query = dict(params or {})
        headers = {"accept": "text/event-stream", "cache-control": "no-cache"}
        if resume_id:
            headers["last-event-id"] = resume_id
            if resume_params is not None:
                query.update(resume_params(resume_id))
        with http.stream("GET", path, params=query, headers=headers, max_retries=0) as response:
            yield response

    deadline = time.monotonic() + timeout if timeout is not None else None
    yield from ReconnectingEventStream(
        connect,
        terminal_events=("end",),
        max_reconnects=max_reconnects,
        last_event_id=last_event_id,
        deadline=deadline,
    )


def decode_event(
    event: ServerSentEvent, models: Mapping[str, type[BaseModel]], event_class: Callable[..., Any]
) -> Any:
    """An event with its JSON data parsed, into ``models[event.event]`` when there is one."""
    try:
        payload = json.loads(event.data) if event.data else None
    except json.JSONDecodeError:
        return event_class(type=event.event, data=event.data, id=event.id)
    model = models.get(event.event)
    if model is not None and isinstance(payload, dict):
        return event_class(type=event.event, data=model.model_validate(payload), id=event.id)
    return event_class(type=event.event, data=payload, id=event.id)
