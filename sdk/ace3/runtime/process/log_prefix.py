"""Prefix every line this process writes to ``sys.stdout``/``sys.stderr`` with ``[rank R] ``.

The wrapper buffers until a newline and writes whole prefixed lines, flushing each one, so the
supervisor can attribute every line even when ranks share one pipe. An explicit ``flush()``
pushes out a pending partial line.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, TextIO


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

    def write(self, text: str) -> int:
        with self._lock:
            self._pending += text
            if "\n" in self._pending:
                complete, _, rest = self._pending.rpartition("\n")
                self._pending = rest
                for line in complete.split("\n"):
                    self._emit(line + "\n")
                self._target.flush()
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
