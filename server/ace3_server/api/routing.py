"""The routers every resource uses: strict JSON bodies, and the error responses each route can
return listed in the OpenAPI document (401 and 503 on every route, the rest where they apply).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field

from ace3_server.api.json_body import StrictJSONRequest


class ErrorOut(BaseModel):
    """Every error but 422: ``detail`` says what went wrong and what to do."""

    detail: str = Field(description="What went wrong, and what to do about it.")


_DESCRIPTIONS = {
    400: "The request is malformed (an artifact path, a body that cannot be parsed).",
    401: "Missing, unknown or revoked API key.",
    404: "No such resource, or it belongs to another owner.",
    409: "The request conflicts with the resource's state (an Idempotency-Key reused with "
    "another body, deleting something a live job uses).",
    413: "The upload is larger than this server's limit (ACE3_MAX_UPLOAD_BYTES).",
    503: "The database is unavailable; retry after the Retry-After header's seconds.",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for these error statuses (422 is FastAPI's own)."""
    responses: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        entry: dict[str, Any] = {"model": ErrorOut, "description": _DESCRIPTIONS[status]}
        if status == 503:
            entry["headers"] = {
                "Retry-After": {
                    "description": "Seconds to wait before retrying.",
                    "schema": {"type": "integer"},
                }
            }
        responses[status] = entry
    return responses


class ApiRoute(APIRoute):
    """A route whose handler reads JSON bodies with :class:`StrictJSONRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict_handler(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict_handler


def resource_router(prefix: str, tag: str) -> APIRouter:
    """The router of one authenticated resource under /v1."""
    return APIRouter(
        prefix=prefix, tags=[tag], route_class=ApiRoute, responses=error_responses(401, 503)
    )
