"""The human output of the CLI shows text from the service literally: never as rich markup,
its control characters (ANSI escapes, bidirectional overrides) escaped."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ace3.cli import output
from ace3.cli.jobs import _log_text

HOSTILE = "[/bold][red]x\x1b[31m[link=https://evil.example]y[/link]\r\u202ez"
SHOWN = "[/bold][red]x\\x1b[31m[link=https://evil.example]y[/link]\\r\\u202ez"


def test_tables_fields_logs_and_messages_show_hostile_text_literally(
    capsys: pytest.CaptureFixture[str],
) -> None:
    output.print_table(HOSTILE, ["ID", HOSTILE], [("a1", HOSTILE), ("a2", {HOSTILE: HOSTILE})])
    output.print_fields(f"job {HOSTILE}", [("name", HOSTILE), ("error", f"line 1\n{HOSTILE}")])
    print(_log_text(SimpleNamespace(rank=0, line=HOSTILE)))
    output.note(f"ace3: {HOSTILE}")
    captured = capsys.readouterr()
    for text in (captured.out, captured.err):
        assert "\x1b" not in text and "\r" not in text and "\u202e" not in text
    # rich folds long cells; the table's lines, joined, hold every value whole
    flat = "".join(line.strip(" │┃|") for line in captured.out.splitlines())
    assert flat.count(SHOWN) >= 5, captured.out
    assert f"[rank 0] {SHOWN}" in captured.out
    assert captured.err == f"ace3: {SHOWN}\n"


def test_printable_keeps_ordinary_text() -> None:
    assert output.printable("loss 0.5\tépoque 2\nnext [bold]") == "loss 0.5\tépoque 2\nnext [bold]"
    assert output.printable("\x00\x07\x7f\x9b") == "\\x00\\x07\\x7f\\x9b"
