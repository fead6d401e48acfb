"""ASGI middleware: request ids on every response, and uploads refused before their body is
read (no valid API key, or more bytes than the cap)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ace3_control.db import DATABASE_UNAVAILABLE_ERRORS
from ace3_control.log_format import request_id_var
from ace3_server.api.deps import UNAUTHORIZED, owner_of_key
from ace3_server.api.error_handlers import (
    DATABASE_UNAVAILABLE_DETAIL,
    RETRY_AFTER_SECONDS,
    log_database_unavailable,
)

UPLOAD_PATHS = ("/v1/models", "/v1/datasets", "/v1/datasets/shards/upload", "/v1/checkpoints")
MULTIPART_OVERHEAD_BYTES = 64 * 1024


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        incoming = headers.get(b"x-request-id", b"").decode("latin-1")[:200]
        request_id = incoming or uuid.uuid4().hex

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [
                    *message["headers"],
                    (b"x-request-id", request_id.encode("latin-1")),
                ]
            await send(message)

        token = request_id_var.set(request_id)  # (the log lines of this request carry it)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            request_id_var.reset(token)


class _BodyTooLarge(HTTPException):
    """Raised from ``receive``: FastAPI passes HTTPExceptions from body parsing through as they are."""

    def __init__(self, limit: int) -> None:
        super().__init__(status_code=413, detail=_too_large_message(limit))


def _too_large_message(limit: int) -> str:
    return f"upload is larger than this server's limit of {limit} bytes (ACE3_MAX_UPLOAD_BYTES)"


async def _send_refusal(
    send: Send, status: int, detail: str, headers: Mapping[str, str] | None = None
) -> None:
    """A JSON error sent before the body was read: the connection closes after it."""
    body = json.dumps({"detail": detail}).encode()
    extra = [(name.lower().encode(), value.encode()) for name, value in (headers or {}).items()]
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                *extra,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _send_413(send: Send, limit: int) -> None:
    await _send_refusal(send, 413, _too_large_message(limit))


async def _authenticated(scope: Scope, headers: dict[bytes, bytes], send: Send) -> bool:
    """Whether the request carries a valid API key; if not, the refusal was sent (401, or 503
    when the database cannot be reached)."""
    scheme, _, key = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
    try:
        owner_id = None
        if scheme.lower() == "bearer" and key:  # read as the route's HTTPBearer reads it
            owner_id = await owner_of_key(scope["app"].state.session_factory, key)
    except DATABASE_UNAVAILABLE_ERRORS as exc:
        log_database_unavailable(exc)
        retry_after = {"Retry-After": str(RETRY_AFTER_SECONDS)}
        await _send_refusal(send, 503, DATABASE_UNAVAILABLE_DETAIL, retry_after)
        return False
    if owner_id is None:
        await _send_refusal(send, 401, UNAUTHORIZED.detail, UNAUTHORIZED.headers)
        return False
    return True


class UploadGuardMiddleware:
    """Refuses uploads before their body is read when the API key is not valid (401) or the
    declared length is past the cap (413), and past the cap as the bytes stream in, before they
    are spooled to disk."""

    def __init__(self, app: ASGIApp, max_upload_bytes: int) -> None:
        self.app = app
        self.max_upload_bytes = max_upload_bytes
        self.max_body_bytes = max_upload_bytes + MULTIPART_OVERHEAD_BYTES

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or scope["path"].rstrip("/") not in UPLOAD_PATHS
        ):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if not await _authenticated(scope, headers, send):
            return
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            await _send_413(send, self.max_upload_bytes)
            return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise _BodyTooLarge(self.max_upload_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _BodyTooLarge:
            if not started:
                await _send_413(send, self.max_upload_bytes)
