"""One reason a config cannot run: :class:`ConfigProblem` (the field and what to do about it),
shared by every check in this package (kept alone so that no check imports another's users)."""

from __future__ import annotations

from pydantic import BaseModel


class ConfigProblem(BaseModel):
    """One reason a config cannot run: the field and what to do about it."""

    field: str
    reason: str
