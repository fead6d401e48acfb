"""What the user verbs print: rich tables for people, JSON for scripts (``--json``: valid JSON on
stdout and nothing else; messages go to stderr).

Text from the service (job names, errors, log lines, parameters) is shown as it is, never read
as rich markup (``[bold]``, ``[link=...]``), and its control characters (ANSI escapes, carriage
returns, bidirectional overrides) are shown escaped (``\\x1b``), so nothing a job or another
program stored can restyle, rewrite or hide what the terminal shows."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel

# C0 controls but tab and newline, DEL, C1 controls, and the bidirectional overrides/isolates.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with its control characters written as escapes (``\\x1b``, ``\\u202e``)."""
    return _CONTROL.sub(lambda m: ascii(m.group())[1:-1], text)


def to_jsonable(value: Any) -> Any:
    """``value`` with pydantic models (and lists of them) dumped the way the API sends them."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {str(key): to_jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(item) for item in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def print_json(value: Any) -> None:
    print(json.dumps(to_jsonable(value), indent=2, default=str))


def print_json_line(value: Any) -> None:
    print(json.dumps(to_jsonable(value), default=str), flush=True)


def _console() -> Any:
    from rich.console import Console

    # Not a terminal (a pipe, a file): wide enough that ids are never cut.
    return Console(width=None if sys.stdout.isatty() else 200, soft_wrap=False)


def cell(value: Any) -> str:
    """``value`` as one table cell or line of text, its control characters escaped."""
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{cell(key)}={cell(item)}" for key, item in value.items()) or "-"
    return printable(str(value))


def _text(value: Any) -> Any:
    """A rich ``Text``: shown literally, never parsed as markup."""
    from rich.text import Text

    return Text(cell(value))


def print_table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    from rich.table import Table

    table = Table(title=_text(title) if title else None, title_justify="left", header_style="bold")
    for column in columns:
        table.add_column(_text(column), overflow="fold")
    for row in rows:
        table.add_row(*(_text(value) for value in row))
    _console().print(table)


def print_fields(title: str | None, fields: Sequence[tuple[str, Any]]) -> None:
    """A two-column table of ``name: value`` pairs (``show`` verbs)."""
    from rich.table import Table

    table = Table(title=_text(title) if title else None, title_justify="left", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value", overflow="fold")
    for name, value in fields:
        table.add_row(_text(name), _text(value))
    _console().print(table)


def duration(start: datetime | None, end: datetime | None) -> str:
    if start is None:
        return "-"
    finish = end or datetime.now(start.tzinfo)
    seconds = int(max(0.0, (finish - start).total_seconds()))
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


def note(message: str) -> None:
    """A message for people, on stderr (stdout stays for the command's output)."""
    print(printable(message), file=sys.stderr, flush=True)
