"""The job's log while its environment is prepared, before the watch loop (which stores the
lines of a running attempt) exists: the service's lines (stream ``service``, which a job cannot
write), stored in small batches so a chatty resolver costs few writes, and never in the way of
the preparation (a line that cannot be stored is dropped and the worker's log says so)."""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy.orm import Session, sessionmaker

from ace3_worker import reports
from ace3_worker.ingest import service_line

logger = logging.getLogger(__name__)

FLUSH_LINES = 50
FLUSH_SECONDS = 0.5
MAX_LINES = 2000  # what one preparation may write (uv's output is tens of lines)


class ServiceLog:
    """A callable ``log(text)`` for one attempt; :meth:`flush` at the end."""

    def __init__(self, sessions: sessionmaker[Session], job_id: str, attempt: int) -> None:
        self.sessions = sessions
        self.job_id = job_id
        self.attempt = attempt
        self._pending: list[reports.LogLine] = []
        self._lock = threading.Lock()
        self._flushed_at = time.monotonic()
        self._written = 0

    def __call__(self, text: str) -> None:
        logger.info("job %s: %s", self.job_id, text)
        with self._lock:
            if self._written + len(self._pending) >= MAX_LINES:
                return
            self._pending.append(service_line(text))
            due = (
                len(self._pending) >= FLUSH_LINES
                or time.monotonic() - self._flushed_at >= FLUSH_SECONDS
            )
        if due:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            lines, self._pending = self._pending, []
            self._flushed_at = time.monotonic()
            self._written += len(lines)
            if not lines:
                return
            try:
                with self.sessions() as session:
                    reports.store_log_lines(session, self.job_id, self.attempt, lines)
                    session.commit()
            except Exception:
                logger.exception("job %s: %d log line(s) not stored", self.job_id, len(lines))
