"""ASGI middleware: request ids on every response, uploads refused before their body is read
(no valid API key, or more bytes than the cap), and every other body capped (JSON)."""

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
from ace3_server.openai_api.errors import PREFIX as OPENAI_PREFIX
from ace3_server.openai_api.errors import error_body, error_type

UPLOAD_PATHS = (
    "/v1/models",
    "/v1/datasets",
    "/v1/datasets/shards/upload",
    "/v1/checkpoints",
    "/openai/v1/files",
)
MULTIPART_OVERHEAD_BYTES = 64 * 1024
#: The JSON body cap when the app's settings do not say (ACE3_MAX_JSON_BYTES).
DEFAULT_MAX_JSON_BYTES = 32 << 20


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

    def __init__(self, detail: str) -> None:
        super().__init__(status_code=413, detail=detail)


def _too_large_message(limit: int) -> str:
    return f"upload is larger than this server's limit of {limit} bytes (ACE3_MAX_UPLOAD_BYTES)"


def _json_too_large_message(limit: int) -> str:
    return (
        f"the request body is larger than this server's limit of {limit} bytes "
        "(ACE3_MAX_JSON_BYTES)"
    )


async def _send_refusal(
    send: Send,
    status: int,
    detail: str,
    headers: Mapping[str, str] | None = None,
    scope: Scope | None = None,
) -> None:
    """A JSON error sent before the body was read: the connection closes after it (in
    OpenAI's shape under /openai/)."""
    if scope is not None and scope["path"].startswith(OPENAI_PREFIX):
        type_, code = error_type(status)
        body = json.dumps(error_body(detail, type_=type_, code=code)).encode()
    else:
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
        await _send_refusal(send, 503, DATABASE_UNAVAILABLE_DETAIL, retry_after, scope)
        return False
    if owner_id is None:
        await _send_refusal(send, 401, UNAUTHORIZED.detail, UNAUTHORIZED.headers, scope)
        return False
    return True


async def _capped(
    app: ASGIApp, scope: Scope, receive: Receive, send: Send, limit: int, detail: str
) -> None:
    """Run ``app`` with a body of at most ``limit`` bytes: refused (413 saying ``detail``)
    before it is read when its Content-Length is past it, and as the bytes stream in."""
    headers = dict(scope.get("headers") or [])
    declared = headers.get(b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        await _send_refusal(send, 413, detail, scope=scope)
        return
    received = 0
    started = False

    async def limited_receive() -> Message:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                raise _BodyTooLarge(detail)
        return message

    async def tracking_send(message: Message) -> None:
        nonlocal started
        if message["type"] == "http.response.start":
            started = True
        await send(message)

    try:
        await app(scope, limited_receive, tracking_send)
    except _BodyTooLarge:
        if not started:
            await _send_refusal(send, 413, detail, scope=scope)


class UploadGuardMiddleware:
    """Refuses uploads before their body is read when the API key is not valid (401) or the
    declared length is past the cap (413), and past the cap as the bytes stream in, before they
    are spooled to disk. Every other request's body (JSON) is capped the same way at
    ``max_json_bytes`` (default: the app's settings' ``max_json_bytes``)."""

    def __init__(
        self, app: ASGIApp, max_upload_bytes: int, max_json_bytes: int | None = None
    ) -> None:
        self.app = app
        self.max_upload_bytes = max_upload_bytes
        self.max_body_bytes = max_upload_bytes + MULTIPART_OVERHEAD_BYTES
        self.max_json_bytes = max_json_bytes

    def _json_limit(self, scope: Scope) -> int:
        if self.max_json_bytes is not None:
            return self.max_json_bytes
        settings = getattr(getattr(scope.get("app"), "state", None), "settings", None)
        limit = getattr(settings, "max_json_bytes", None)
        return limit if isinstance(limit, int) else DEFAULT_MAX_JSON_BYTES

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] != "POST" or scope["path"].rstrip("/") not in UPLOAD_PATHS:
            limit = self._json_limit(scope)
            await _capped(self.app, scope, receive, send, limit, _json_too_large_message(limit))
            return
        headers = dict(scope.get("headers") or [])
        if not await _authenticated(scope, headers, send):
            return
        limit, detail = self.max_body_bytes, _too_large_message(self.max_upload_bytes)
        await _capped(self.app, scope, receive, send, limit, detail)
