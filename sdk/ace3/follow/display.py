"""What the live displays of jobs and searches share: the mode (a rich view on a terminal,
plain lines elsewhere, or nothing), the enter / close / note protocol, elapsed time and the
number format. ``rich`` is imported only by the live views."""

from __future__ import annotations

import math
import sys
import time
from typing import Any, Literal, TextIO, TypeVar

DisplayMode = Literal["auto", "plain", "none"]

DisplayT = TypeVar("DisplayT", bound="FollowDisplay")


def display_mode(show_progress: bool | None) -> DisplayMode:
    """``show_progress`` of ``wait()``: None shows nothing, True a live view (plain lines when
    stdout is not a terminal), False plain lines."""
    if show_progress is None:
        return "none"
    return "auto" if show_progress else "plain"


def choose_display(
    mode: DisplayMode,
    file: TextIO | None,
    silent: type[DisplayT],
    plain: type[DisplayT],
    live: type[DisplayT],
) -> tuple[type[DisplayT], TextIO]:
    """The display class for ``mode`` (``auto``: live on a terminal, plain lines elsewhere)
    and the stream it writes to (stdout unless ``file`` is given)."""
    out = file if file is not None else sys.stdout
    if mode == "none":
        return silent, out
    if mode == "auto" and is_terminal(out):
        return live, out
    return plain, out


def is_terminal(out: TextIO) -> bool:
    try:
        return bool(out.isatty())
    except (AttributeError, ValueError):
        return False


def format_value(value: float) -> str:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return str(value)
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


class FollowDisplay:
    """Shows nothing; the base of every display. A live view sets ``_console`` (a rich
    console) while it runs and stops it in :meth:`_stop_live`; notes go above the live view
    while it runs and to ``out`` as plain lines otherwise."""

    def __init__(self, out: TextIO):
        self.out = out
        self.started = time.monotonic()
        self._console: Any = None

    def __enter__(self: DisplayT) -> DisplayT:
        self._on_start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def handle(self, event: Any) -> None:
        """Show one event of the stream (the subclasses know their events)."""

    def close(self) -> None:
        if self._console is not None:
            self._console = None
            self._stop_live()

    def note(self, message: str) -> None:
        """A message of the SDK's own (e.g. that Ctrl-C cancelled the run); always shown."""
        if self._console is None:
            print(message, file=self.out, flush=True)
            return
        from rich.text import Text

        self._console.print(Text(message), soft_wrap=True)

    def _on_start(self) -> None:
        pass

    def _stop_live(self) -> None:
        pass

    def _elapsed(self) -> str:
        seconds = int(time.monotonic() - self.started)
        return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
