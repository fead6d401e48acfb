"""The SDK's synchronous HTTP core: auth, request ids, retries with backoff, typed errors.

Every API call goes through :meth:`HTTPClient.request` (or :meth:`HTTPClient.stream` for
server-sent events and downloads). Retried: connection errors, timeouts, 408, 429 and 5xx,
with exponential backoff and full jitter, honouring ``retry-after``. A POST is retried only
when it is idempotent: it carries an ``Idempotency-Key`` (the same key on every attempt) or
the caller marks it so.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import random
import time
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

import httpx

from ace3._version import __version__ as SDK_VERSION
from ace3.errors import APIConnectionError, APIStatusError, APITimeoutError, status_error_class

USER_AGENT = f"ace3-python/{SDK_VERSION}"

DEFAULT_TIMEOUT = 60.0
DEFAULT_MAX_RETRIES = 2
INITIAL_RETRY_DELAY = 0.5  # seconds, doubled on every retry
MAX_RETRY_DELAY = 8.0  # ceiling of the exponential backoff
MAX_RETRY_AFTER = 60.0  # a server's retry-after longer than this is capped to it
STREAM_READ_TIMEOUT = 45.0  # SSE sends a keep-alive every 15 s: 3 missed ones = dead stream

RETRYABLE_STATUS = frozenset({408, 429})
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})


def _sleep(seconds: float) -> None:  # one place for tests to patch
    time.sleep(seconds)


def new_request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


def should_retry_status(status_code: int) -> bool:
    return status_code in RETRYABLE_STATUS or status_code >= 500


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``retry-after`` header (seconds or an HTTP date), or None."""
    value = headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        current = datetime.now(UTC).timestamp() if now is None else now
        seconds = when.timestamp() - current
    if seconds != seconds:  # NaN
        return None
    return max(0.0, seconds)


def retry_delay(retries_done: int, headers: Mapping[str, str] | None = None) -> float:
    """How long to wait before retry number ``retries_done + 1``.

    The server's ``retry-after`` wins (capped at MAX_RETRY_AFTER); otherwise exponential
    backoff with full jitter: uniform in [0, min(MAX_RETRY_DELAY, INITIAL * 2**retries_done)].
    """
    if headers is not None:
        retry_after = parse_retry_after(headers)
        if retry_after is not None:
            return min(retry_after, MAX_RETRY_AFTER)
    ceiling = min(MAX_RETRY_DELAY, INITIAL_RETRY_DELAY * (2**retries_done))
    return random.uniform(0.0, ceiling)


def _decode_body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
        return response.text


def make_status_error(response: httpx.Response, request_id: str | None = None) -> APIStatusError:
    """The typed error for an error response (whose body must already be read)."""
    body = _decode_body(response)
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, str):
        message = detail
    elif detail is not None:
        message = json.dumps(detail)
    elif isinstance(body, str) and body.strip():
        message = body.strip()[:1000]
    else:
        message = response.reason_phrase or "error"
    error_class = status_error_class(response.status_code)
    return error_class(
        response.status_code,
        message,
        response.headers.get("x-request-id") or request_id,
        body,
        response=response,
    )


class HTTPClient:
    """One connection pool to an ACE3 server, with the SDK's retry and error policy."""

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        timeout: float | httpx.Timeout | None = DEFAULT_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        transport: httpx.BaseTransport | None = None,
    ):
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.base_url = base_url.rstrip("/")
        self.max_retries = max_retries
        self.timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        self._transport = transport
        self._client = httpx.Client(
            base_url=self.base_url,
            timeout=self.timeout,
            transport=transport,
            headers={
                "authorization": f"Bearer {api_key}",
                "user-agent": USER_AGENT,
                "accept": "application/json",
            },
            follow_redirects=False,
        )

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def is_closed(self) -> bool:
        return self._client.is_closed

    def close(self) -> None:
        self._client.close()

    # -- requests -------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
        data: Mapping[str, Any] | None = None,
        files: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        idempotent: bool | None = None,
        max_retries: int | None = None,
        timeout: httpx.Timeout | None = None,
    ) -> httpx.Response:
        """Send one logical request (retrying it as the policy allows) and return the
        response, whose body is read. Error statuses raise the typed errors. ``timeout``
        replaces the client's for this request (one the server answers slowly)."""
        request_kwargs = self._request_kwargs(
            params=params, json_body=json_body, data=data, files=files
        )
        if timeout is not None:
            request_kwargs["timeout"] = timeout
        for attempt, request in self._attempts(
            method, path, headers, idempotency_key, idempotent, max_retries, request_kwargs
        ):
            response = self._send(request, attempt, stream=False)
            if response is not None:
                return response
        raise AssertionError("unreachable")  # pragma: no cover

    @contextlib.contextmanager
    def stream(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        max_retries: int | None = None,
        read_timeout: float | None = STREAM_READ_TIMEOUT,
    ) -> Iterator[httpx.Response]:
        """Open a streaming response (SSE, downloads). Establishing it is retried like any
        request; once the response is yielded, a dropped stream is the caller's to handle."""
        timeout = self.timeout
        if read_timeout is not None and (timeout.read is None or timeout.read < read_timeout):
            timeout = httpx.Timeout(
                connect=timeout.connect, read=read_timeout, write=timeout.write, pool=timeout.pool
            )
        request_kwargs = self._request_kwargs(params=params)
        request_kwargs["timeout"] = timeout
        for attempt, request in self._attempts(
            method, path, headers, None, None, max_retries, request_kwargs
        ):
            response = self._send(request, attempt, stream=True)
            if response is None:
                continue
            if response.status_code == 307 and "location" in response.headers:
                with self._presigned(response, timeout) as stored:
                    yield stored
                return
            try:
                yield response
            finally:
                response.close()
            return

    @contextlib.contextmanager
    def _presigned(
        self, redirect: httpx.Response, timeout: httpx.Timeout
    ) -> Iterator[httpx.Response]:
        """A download the server redirected to a presigned URL of its object store: fetched
        without this client's headers (the API key never goes to the store), with the
        server's ``x-checksum-sha256`` (and other ``x-`` headers) kept for the caller."""
        redirect.close()
        kept = {k: v for k, v in redirect.headers.items() if k.lower().startswith("x-")}
        with httpx.Client(
            timeout=timeout, transport=self._transport, follow_redirects=False
        ) as plain:
            try:
                response = plain.send(
                    plain.build_request("GET", redirect.headers["location"]), stream=True
                )
            except httpx.TransportError as exc:
                raise APIConnectionError(
                    f"could not download from the server's object store: {exc}",
                    request=redirect.request,
                ) from exc
            try:
                if not response.is_success:
                    response.read()
                    raise make_status_error(response, redirect.headers.get("x-request-id"))
                for name, value in kept.items():
                    response.headers.setdefault(name, value)
                yield response
            finally:
                response.close()

    # -- internals ------------------------------------------------------------------------

    @staticmethod
    def _request_kwargs(
        *,
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
        data: Mapping[str, Any] | None = None,
        files: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if params:
            kwargs["params"] = {key: value for key, value in params.items() if value is not None}
        if json_body is not None:
            kwargs["json"] = json_body
        if data:
            kwargs["data"] = {key: value for key, value in data.items() if value is not None}
        if files:
            kwargs["files"] = files
        return kwargs

    def _attempts(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str] | None,
        idempotency_key: str | None,
        idempotent: bool | None,
        max_retries: int | None,
        request_kwargs: dict[str, Any],
    ) -> Iterator[tuple[_Attempt, httpx.Request]]:
        method = method.upper()
        if idempotent is None:
            idempotent = method in IDEMPOTENT_METHODS or idempotency_key is not None
        retries = self.max_retries if max_retries is None else max_retries
        attempt = _Attempt(max_retries=retries if idempotent else 0)
        while True:
            request_headers = dict(headers or {})
            request_headers.setdefault("x-request-id", new_request_id())
            if idempotency_key is not None:
                request_headers["idempotency-key"] = idempotency_key  # same key every attempt
            request = self._client.build_request(
                method, path, headers=request_headers, **request_kwargs
            )
            yield attempt, request
            attempt.retries_done += 1

    def _send(
        self, request: httpx.Request, attempt: _Attempt, *, stream: bool
    ) -> httpx.Response | None:
        """One attempt. Returns the response, or None after sleeping when it should be
        retried; raises the typed error when it should not."""
        request_id = request.headers.get("x-request-id")
        try:
            response = self._client.send(request, stream=stream)
        except httpx.TimeoutException as exc:
            if attempt.can_retry:
                _sleep(retry_delay(attempt.retries_done))
                return None
            raise APITimeoutError(
                f"request timed out: {request.method} {request.url} ({exc})", request=request
            ) from exc
        except httpx.TransportError as exc:
            if attempt.can_retry:
                _sleep(retry_delay(attempt.retries_done))
                return None
            raise APIConnectionError(
                f"could not reach the ACE3 server at {self.base_url}: {exc or type(exc).__name__}",
                request=request,
            ) from exc

        if response.is_success or (stream and response.status_code == 307):
            return response
        try:
            response.read()
        except httpx.HTTPError:
            pass
        finally:
            if stream:
                response.close()
        if should_retry_status(response.status_code) and attempt.can_retry:
            _sleep(retry_delay(attempt.retries_done, response.headers))
            return None
        raise make_status_error(response, request_id)


class _Attempt:
    __slots__ = ("max_retries", "retries_done")

    def __init__(self, max_retries: int):
        self.max_retries = max_retries
        self.retries_done = 0

    @property
    def can_retry(self) -> bool:
        return self.retries_done < self.max_retries
