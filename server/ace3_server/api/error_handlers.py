"""Exception handlers: every error the API answers is JSON, and none leaks internals.

- The database unreachable (refused, dropped, pool exhausted): 503 with ``Retry-After``.
- 422: the validation errors, with values JSON cannot carry (NaN, bytes, lone surrogates)
  written as text instead of failing to serialise.
- 405: ``Allow`` lists every method of the path, not only the first route's.
- Anything else: a JSON 500 that says nothing about the cause (the log has it).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.routing import Match

from ace3_control.db import DATABASE_UNAVAILABLE_ERRORS

logger = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 5
DATABASE_UNAVAILABLE_DETAIL = (
    "the database is unavailable right now (the service cannot reach it): retry in a few "
    "seconds; if it persists, tell the service's operator"
)
INTERNAL_ERROR_DETAIL = (
    "internal server error: the service logged the cause; retry, and if it persists tell the "
    "service's operator when it happened"
)


def database_unavailable_response() -> JSONResponse:
    return JSONResponse(
        {"detail": DATABASE_UNAVAILABLE_DETAIL},
        status_code=503,
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )


def log_database_unavailable(exc: BaseException) -> None:
    logger.warning("database unavailable: %s: %s", type(exc).__name__, exc)


async def _database_unavailable(request: Request, exc: Exception) -> Response:
    log_database_unavailable(exc)
    return database_unavailable_response()


def json_safe(value: Any) -> Any:
    """``value`` (already through ``jsonable_encoder``) with what strict JSON cannot carry
    written as text: NaN and infinities, bytes, strings with lone surrogates."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {json_safe(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


async def _validation_failed(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = jsonable_encoder(
        exc.errors(), custom_encoder={bytes: lambda raw: raw.decode("utf-8", "replace")}
    )
    return JSONResponse({"detail": json_safe(errors)}, status_code=422)


HTTP_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route of the app fully matches at this request's path (each method is
    tried: routers nest, and the 405 a route raises names only its own methods)."""
    allowed = []
    for method in HTTP_METHODS:
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] == Match.FULL for route in request.app.router.routes):
            allowed.append(method)
    return allowed


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = ", ".join(allowed_methods(request))
    safe = HTTPException(exc.status_code, detail=json_safe(exc.detail), headers=headers or None)
    return await http_exception_handler(request, safe)


async def _internal_error(request: Request, exc: Exception) -> Response:
    if isinstance(exc, DATABASE_UNAVAILABLE_ERRORS):
        return database_unavailable_response()
    return JSONResponse({"detail": INTERNAL_ERROR_DETAIL}, status_code=500)


def install_error_handlers(app: FastAPI) -> None:
    for error in DATABASE_UNAVAILABLE_ERRORS:
        app.add_exception_handler(error, _database_unavailable)
    app.add_exception_handler(RequestValidationError, _validation_failed)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _internal_error)
