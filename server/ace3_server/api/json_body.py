"""Reading JSON request bodies strictly: what Python's ``json`` accepts but the API cannot store.

``json.loads`` takes ``NaN`` and ``Infinity`` (not JSON numbers), strings with NUL characters or
lone surrogates (Postgres text cannot hold them) and any nesting its recursion limit allows.
Each is refused here with a 422 that names the field, before the body is validated.
"""

from __future__ import annotations

import json
import math
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from ace3_server.errors import field_error
from ace3_server.storable import text_problem

MAX_JSON_DEPTH = 64
#: Bodies larger than this are parsed and checked off the event loop.
THREADPOOL_BYTES = 256 * 1024
NOT_A_NUMBER = "NaN and Infinity are not JSON numbers: send a finite number (or null)"

Location = list[str | int]


def _children(value: Any, path: Location) -> list[tuple[Any, Location]]:
    if isinstance(value, dict):
        return [(item, [*path, key]) for key, item in value.items()]
    if isinstance(value, list):
        return [(item, [*path, index]) for index, item in enumerate(value)]
    return []


def _key_problems(value: Any, path: Location) -> tuple[Location, str] | None:
    if not isinstance(value, dict):
        return None
    for key in value:
        problem = text_problem(key)
        if problem is not None:
            return [*path, key.encode("utf-8", "backslashreplace").decode()], f"key {problem}"
    return None


def unstorable_value(document: Any) -> tuple[Location, str] | None:
    """(where, why) of the first value the API refuses in a parsed body, or None."""
    pending: list[tuple[Any, Location]] = [(document, [])]
    while pending:
        value, path = pending.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return path, NOT_A_NUMBER
        if isinstance(value, str):
            problem = text_problem(value)
            if problem is not None:
                return path, problem
            continue
        if len(path) >= MAX_JSON_DEPTH and isinstance(value, dict | list):
            return path, f"is nested deeper than {MAX_JSON_DEPTH} levels"
        key_problem = _key_problems(value, path)
        if key_problem is not None:
            return key_problem
        pending.extend(reversed(_children(value, path)))
    return None


def _parsed(raw: bytes) -> tuple[Any, tuple[Location, str] | None]:
    document = json.loads(raw)
    return document, unstorable_value(document)


class StrictJSONRequest(Request):
    """A request whose ``json()`` refuses NaN, Infinity, unstorable text and deep nesting."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            raw = await self.body()
            if len(raw) > THREADPOOL_BYTES:  # (the middleware capped it: ACE3_MAX_JSON_BYTES)
                document, problem = await run_in_threadpool(_parsed, raw)
            else:
                document, problem = _parsed(raw)
            if problem is not None:
                where, why = problem
                raise field_error(["body", *where], why, "value_error")
            self._json = document
        return self._json
