"""Prefix every line this process writes to ``sys.stdout``/``sys.stderr`` with ``[rank R] ``.

The wrapper buffers until a newline and writes whole prefixed lines, flushing each one, so the
supervisor can attribute every line even when ranks share one pipe (torchrun's ranks inherit
its stdout and stderr). A write to a pipe is whole only up to ``PIPE_BUF`` bytes (4096 on
Linux): a longer line would be split by the kernel, another rank's line could land inside it,
and its rest would reach the worker without a prefix, stored without its rank. So a line longer
than that is written as several pieces, each prefixed, ended by a newline and written at once
(each is stored as a line of its rank); past ``MAX_LINE_CHARS`` characters (what the worker
keeps of a line) the rest is replaced by one piece saying how much was left out. An explicit
``flush()`` pushes out a pending partial line (a progress bar's); what a rank writes to its file
descriptors directly (a subprocess, a C library) carries no prefix.
"""

from __future__ import annotations

import select
import sys
import threading
from typing import Any, TextIO

PIPE_BUF = getattr(select, "PIPE_BUF", 512)
MAX_LINE_CHARS = 8192  # (the worker's cut: ace3_worker.reports.MAX_LINE_CHARS)


def pieces(text: str, room: int) -> list[str]:
    """``text`` in pieces of at most ``room`` bytes of UTF-8 each, cut between characters (a
    lone surrogate counts as ``?``)."""
    data = text.encode("utf-8", "replace")
    found: list[str] = []
    while data:
        cut = min(room, len(data))
        while 0 < cut < len(data) and data[cut] & 0xC0 == 0x80:  # (inside a character)
            cut -= 1
        cut = cut or min(room, len(data))
        found.append(data[:cut].decode("utf-8", "replace"))
        data = data[cut:]
    return found


class PrefixedStream:
    """A text stream that writes ``prefix`` at the start of every line to ``target``."""

    def __init__(self, target: TextIO, prefix: str) -> None:
        self._target = target
        self._prefix = prefix
        self._pending = ""
        self._at_line_start = True
        self._lock = threading.RLock()

    @property
    def target(self) -> TextIO:
        return self._target

    def _emit(self, text: str) -> None:
        if self._at_line_start:
            text = self._prefix + text
        self._target.write(text)
        self._at_line_start = text.endswith("\n")

    def _emit_line(self, line: str) -> None:
        """A complete line (without its newline), in pieces that each reach the pipe at once."""
        room = PIPE_BUF - len(self._prefix.encode()) - 1
        shown = line[:MAX_LINE_CHARS]
        parts = pieces(shown, room) or [""]
        if len(line) > len(shown):
            parts.append(f"(the line went on for {len(line) - len(shown)} more characters)")
        for part in parts:
            self._emit(part + "\n")
            self._target.flush()

    def write(self, text: str) -> int:
        with self._lock:
            self._pending += text
            if "\n" in self._pending:
                complete, _, rest = self._pending.rpartition("\n")
                self._pending = rest
                for line in complete.split("\n"):
                    self._emit_line(line)
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        with self._lock:
            if self._pending:
                self._emit(self._pending)
                self._pending = ""
            self._target.flush()

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


def install_log_prefix(rank: int) -> None:
    """Wrap ``sys.stdout`` and ``sys.stderr`` (idempotent)."""
    prefix = f"[rank {rank}] "
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, PrefixedStream):
            continue
        setattr(sys, name, PrefixedStream(stream, prefix))


def uninstall_log_prefix() -> None:
    """Flush and restore the original streams."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, PrefixedStream):
            stream.flush()
            setattr(sys, name, stream.target)
