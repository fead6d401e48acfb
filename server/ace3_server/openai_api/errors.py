"""OpenAI's error shape for every answer under ``/openai/v1``: ``{"error": {"message", "type",
"param", "code"}}`` with OpenAI's status codes. The routes raise ACE3's own errors (the services'
HTTPExceptions, 422 lists included) or :class:`OpenAIError`; :class:`OpenAIRoute` writes each in
this shape: a 422 list of problems becomes a 400 naming the first problem's field as ``param``,
a 401 is ``invalid_api_key``, and the database being unreachable a 503 with ``Retry-After``."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from fastapi import HTTPException as FastAPIHTTPException
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ace3_control.db import DATABASE_UNAVAILABLE_ERRORS
from ace3_server.api.error_handlers import (
    DATABASE_UNAVAILABLE_DETAIL,
    RETRY_AFTER_SECONDS,
    json_safe,
    log_database_unavailable,
)
from ace3_server.api.routing import ApiRoute

PREFIX = "/openai/v1"
#: OpenAI's ``type`` and ``code`` for the statuses ACE3 answers.
_TYPES = {
    401: ("invalid_request_error", "invalid_api_key"),
    404: ("invalid_request_error", "not_found"),
    409: ("invalid_request_error", "conflict"),
    413: ("invalid_request_error", "file_too_large"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
}


class OpenAIError(HTTPException):
    """An error this API raises itself, with OpenAI's ``param`` and ``code``."""

    def __init__(
        self, status_code: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(status_code=status_code, detail=message)
        self.param = param
        self.code = code


def error_body(
    message: str, *, type_: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_type(status: int) -> tuple[str, str | None]:
    """(OpenAI's ``type``, a default ``code``) for an HTTP status."""
    if status in _TYPES:
        return _TYPES[status]
    if status >= 500:
        return "server_error", None
    return "invalid_request_error", None


def param_of(loc: Sequence[str | int]) -> str:
    """``["body", "config", "max_steps"]`` -> ``ace3.max_steps`` (the config came from
    ``extra_body={"ace3": ...}``); ``["body", "hyperparameters", "x"]`` ->
    ``hyperparameters.x``; a query or path parameter by its own name."""
    parts = [str(part) for part in loc]
    if parts[:1] in (["body"], ["query"], ["path"], ["header"]):
        parts = parts[1:]
    if parts[:1] == ["config"]:
        parts = ["ace3", *parts[1:]]
    return ".".join(parts)


def _problems_message(problems: list[Any]) -> tuple[str, str | None]:
    """A 422 list of ``{"loc", "msg"}`` as one message and the first problem's ``param``."""
    lines, first = [], None
    for problem in problems:
        if not isinstance(problem, dict):
            lines.append(str(problem))
            continue
        param = param_of(problem.get("loc") or [])
        first = first or param or None
        lines.append(f"{param}: {problem.get('msg')}" if param else str(problem.get("msg")))
    return "; ".join(lines), first


def openai_error_response(exc: HTTPException) -> JSONResponse:
    """``exc`` (ACE3's or :class:`OpenAIError`) in OpenAI's shape."""
    status, detail = exc.status_code, json_safe(exc.detail)
    param = getattr(exc, "param", None)
    type_, code = error_type(status)
    code = getattr(exc, "code", None) or code
    if isinstance(detail, list):  # ACE3's 422: every problem, each naming its field
        message, param = _problems_message(detail)
        status = 400
    else:
        message = str(detail)
        if status == 422:
            status = 400
    headers = {k: v for k, v in (exc.headers or {}).items() if k.lower() != "content-length"}
    return JSONResponse(
        error_body(message, type_=type_, param=param, code=code),
        status_code=status,
        headers=headers or None,
    )


def database_unavailable() -> JSONResponse:
    return JSONResponse(
        error_body(DATABASE_UNAVAILABLE_DETAIL, type_="server_error", code="service_unavailable"),
        status_code=503,
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )


class OpenAIRoute(ApiRoute):
    """A route whose errors are answered in OpenAI's shape (its body read strictly, as every
    ACE3 route's)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def openai_handler(request: Request) -> Response:
            try:
                return await handler(request)
            except HTTPException as exc:
                return openai_error_response(exc)
            except RequestValidationError as exc:
                errors = [{"loc": e.get("loc", ()), "msg": e.get("msg")} for e in exc.errors()]
                return openai_error_response(FastAPIHTTPException(422, detail=errors))
            except DATABASE_UNAVAILABLE_ERRORS as exc:
                log_database_unavailable(exc)
                return database_unavailable()

        return openai_handler
