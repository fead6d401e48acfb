"""How much a job may log: a rate (lines and bytes per second, with bursts) and a total.

A job that prints without end must neither grow ``job_logs`` without bound nor keep its worker
busy storing lines (the heartbeat then starves and the lease expires). The pump threads ask the
limiter about every line before it is queued; a line refused is only counted. When lines are
accepted again (and at the end of the attempt) the supervisor stores one marker line saying how
many were dropped and why.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

BURST_SECONDS = 10.0


@dataclass
class _Bucket:
    """A token bucket: ``rate`` per second, holding at most ``rate * BURST_SECONDS``."""

    rate: float
    tokens: float = field(init=False)
    updated: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.tokens = self.rate * BURST_SECONDS

    def refill(self, now: float) -> None:
        self.tokens = min(self.rate * BURST_SECONDS, self.tokens + (now - self.updated) * self.rate)
        self.updated = now


@dataclass
class LogLimiter:
    """Shared by an attempt's stdout and stderr pumps (thread-safe)."""

    lines_per_second: float
    bytes_per_second: float
    max_total_bytes: int
    stored_bytes: int = 0
    _dropped: int = 0
    _dropped_for: str = ""
    _lines: _Bucket = field(init=False)
    _bytes: _Bucket = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._lines = _Bucket(self.lines_per_second)
        self._bytes = _Bucket(self.bytes_per_second)

    def admit(self, size_bytes: int) -> bool:
        """Whether a line of ``size_bytes`` may be stored now (else it is counted)."""
        with self._lock:
            now = time.monotonic()
            self._lines.refill(now)
            self._bytes.refill(now)
            if self.stored_bytes + size_bytes > self.max_total_bytes:
                reason = f"the attempt's log reached {self.max_total_bytes} bytes"
            elif self._lines.tokens < 1 or self._bytes.tokens < size_bytes:
                reason = (
                    f"more than {self.lines_per_second:g} lines or "
                    f"{self.bytes_per_second:g} bytes per second"
                )
            else:
                self._lines.tokens -= 1
                self._bytes.tokens -= size_bytes
                self.stored_bytes += size_bytes
                return True
            self._dropped += 1
            self._dropped_for = reason
            return False

    def drop(self, reason: str) -> None:
        """Count a line refused for another reason (the worker cannot store lines fast enough)."""
        with self._lock:
            self._dropped += 1
            self._dropped_for = reason

    def take_dropped(self) -> str | None:
        """The marker for lines dropped since the last call, or None."""
        with self._lock:
            if not self._dropped:
                return None
            count, reason, self._dropped = self._dropped, self._dropped_for, 0
        noun = "line" if count == 1 else "lines"
        return f"ace3: {count} log {noun} dropped ({reason})"
