"""What the database can store, for checks before a value reaches it: text without NUL
characters or lone surrogates (Postgres text holds neither), integers within INTEGER (32-bit
signed) and BIGINT (64-bit signed)."""

from __future__ import annotations

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored as text, or None."""
    if "\x00" in value:
        return "contains a NUL character (\\x00), which cannot be stored: remove it"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode (it holds a lone surrogate): send UTF-8 text"
    return None
