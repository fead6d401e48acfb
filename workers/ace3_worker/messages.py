"""Publishing a job's message again from the worker: a hand-back, a retry, a gang's copies.

A publish that fails is logged, never raised: the job's row is already committed, and the
reconciler re-publishes a queued job whose message was lost. :class:`RecentCopies` is what a
worker process remembers of the copies it sent, so that copies of one job never multiply.
"""

from __future__ import annotations

import logging
import time

from ace3_control.queue import JobPublisher
from ace3_control.settings import Settings

logger = logging.getLogger(__name__)


def publish(
    settings: Settings,
    job_id: str,
    *,
    copies: int = 1,
    countdown: float | None = None,
    on_failure: str,
) -> None:
    """Send ``copies`` messages for the job (delayed by ``countdown`` seconds); ``on_failure``
    is what the log says when the broker refuses them."""
    publisher = JobPublisher(settings)
    try:
        for _ in range(copies):
            publisher.publish(job_id, countdown=countdown)
    except Exception:
        logger.exception("job %s: %s", job_id, on_failure)
    finally:
        publisher.close()


class RecentCopies:
    """The jobs this process sent a delayed copy of, and when (``time.monotonic()``).

    A copy sent back with a delay comes back after it; a copy of the same job that arrives
    within half the delay is another copy, which the caller drops."""

    def __init__(self) -> None:
        self._sent_at: dict[str, float] = {}

    def sent_within(self, job_id: str, delay: float) -> bool:
        """Whether a copy of the job went out less than ``delay / 2`` ago."""
        now = time.monotonic()
        for stale in [key for key, at in self._sent_at.items() if now - at >= delay / 2]:
            del self._sent_at[stale]
        return job_id in self._sent_at

    def note(self, job_id: str) -> None:
        self._sent_at[job_id] = time.monotonic()
