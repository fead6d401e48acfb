"""Errors of a request to the ACE3 API: no response (connection, timeout), or a 4xx/5xx answer
(:class:`APIStatusError` and one subclass per status), and :func:`status_error_class`."""

from __future__ import annotations

from typing import Any

import httpx

from ace3.errors.base import ACE3Error

__all__ = [
    "APIConnectionError",
    "APIStatusError",
    "APITimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "ConflictError",
    "InternalServerError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RateLimitError",
    "ValidationError",
    "status_error_class",
]


# -- transport ------------------------------------------------------------------------------


class APIConnectionError(ACE3Error):
    """The request never got an HTTP response: the server is unreachable or the connection
    dropped. Raised after the SDK's own retries are spent."""

    def __init__(self, message: str = "Connection error.", *, request: httpx.Request | None = None):
        super().__init__(message)
        self.message = message
        self.request = request


class APITimeoutError(APIConnectionError):
    """The request timed out (after the SDK's own retries)."""

    def __init__(
        self, message: str = "Request timed out.", *, request: httpx.Request | None = None
    ):
        super().__init__(message, request=request)


# -- HTTP status ----------------------------------------------------------------------------


class APIStatusError(ACE3Error):
    """The server answered with a 4xx or 5xx status.

    ``message`` is the server's ``detail`` (or the body's text); ``request_id`` the
    ``x-request-id`` of the response, to quote when reporting a problem; ``body`` the decoded
    JSON body (or the text when it is not JSON).
    """

    def __init__(
        self,
        status_code: int,
        message: str,
        request_id: str | None = None,
        body: Any = None,
        *,
        response: httpx.Response | None = None,
    ):
        self.status_code = status_code
        self.message = message
        self.request_id = request_id
        self.body = body
        self.response = response
        super().__init__(self._render())

    def _render(self) -> str:
        text = f"{self.status_code}: {self.message}"
        if self.request_id:
            text += f" (request id: {self.request_id})"
        return text

    # keep errors picklable despite the keyword-only response
    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.status_code, self.message, self.request_id, self.body))


class BadRequestError(APIStatusError):
    """400: the request is malformed."""


class AuthenticationError(APIStatusError):
    """401: the API key is missing, unknown or revoked. Check ACE3_API_KEY."""


class PermissionDeniedError(APIStatusError):
    """403: the key may not do this."""


class NotFoundError(APIStatusError):
    """404: the resource does not exist, or belongs to another owner."""


class ConflictError(APIStatusError):
    """409: an Idempotency-Key reused with another body, deleting something in use, or testing
    a webhook whose last ping is still pending."""


class PayloadTooLargeError(APIStatusError):
    """413: the upload is over the server's size cap; nothing was stored."""


class RateLimitError(APIStatusError):
    """429: too many requests (raised once the SDK's retries are spent)."""


class InternalServerError(APIStatusError):
    """5xx: the server failed (raised once the SDK's retries are spent)."""


class ValidationError(APIStatusError):
    """422: one or more fields are invalid, or ask for something not implemented yet.

    ``errors`` is the server's list of ``{"loc": [...], "msg": "...", "type": "..."}``; the
    message names every field and its reason.
    """

    def __init__(
        self,
        status_code: int,
        message: str,
        request_id: str | None = None,
        body: Any = None,
        *,
        response: httpx.Response | None = None,
    ):
        detail = body.get("detail") if isinstance(body, dict) else None
        self.errors: list[dict[str, Any]] = (
            [item for item in detail if isinstance(item, dict)] if isinstance(detail, list) else []
        )
        if self.errors:
            message = "invalid request: " + "; ".join(
                f"{_field_name(item.get('loc'))}: {item.get('msg', 'invalid')}"
                for item in self.errors
            )
        super().__init__(status_code, message, request_id, body, response=response)


def _field_name(loc: Any) -> str:
    """``["body", "config", "batch_size"]`` -> ``config.batch_size``."""
    if not isinstance(loc, list | tuple) or not loc:
        return "request"
    parts = [str(part) for part in loc]
    if len(parts) > 1 and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    return ".".join(parts)


_STATUS_ERRORS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    422: ValidationError,
    429: RateLimitError,
}


def status_error_class(status_code: int) -> type[APIStatusError]:
    """The error class for an HTTP status (``APIStatusError`` for an unlisted one)."""
    if status_code >= 500:
        return InternalServerError
    return _STATUS_ERRORS.get(status_code, APIStatusError)
