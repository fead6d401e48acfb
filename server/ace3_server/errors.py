"""HTTP errors in the API's one shape: ``detail`` is a message, or for 422 a list naming each field."""

from __future__ import annotations

from fastapi import HTTPException


def field_error(loc: list[str | int], msg: str, type_: str = "value_error") -> HTTPException:
    return HTTPException(status_code=422, detail=[{"loc": loc, "msg": msg, "type": type_}])


def not_found(what: str) -> HTTPException:
    return HTTPException(status_code=404, detail=f"{what} not found")


def payload_too_large(limit: int) -> HTTPException:
    return HTTPException(
        status_code=413,
        detail=f"upload is larger than this server's limit of {limit} bytes (ACE3_MAX_UPLOAD_BYTES)",
    )
