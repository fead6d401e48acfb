"""Request parameter types that accept only what the database can hold (see
``ace3_server.storable``): anything else is a 422 naming the parameter, never a database error.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Query
from pydantic import AfterValidator, Field

from ace3_server.storable import INT32_MAX, INT64_MAX, text_problem


def _storable_text(value: str) -> str:
    problem = text_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


StoredText = Annotated[str, AfterValidator(_storable_text)]
"""Text that is stored or compared with a text column: ids, names, cursors."""

Int32 = Annotated[int, Field(le=INT32_MAX, ge=-INT32_MAX - 1)]
"""An integer compared with an INTEGER column (a step, an attempt)."""

Int64 = Annotated[int, Field(le=INT64_MAX, ge=-INT64_MAX - 1)]
"""An integer compared with a BIGINT column (metric and log sequence numbers)."""

PageCursor = Annotated[
    StoredText | None, Query(description="The next_cursor of the previous page.")
]
