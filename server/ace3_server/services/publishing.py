"""The API's publishes: on a thread of their own, so a slow broker holds no request.

A job's row is committed first and is the truth; the Celery message only says "there is
work". A publish used to run in the shared threadpool (``run_in_threadpool``): with Redis
frozen every blocked publish held one of anyio's 40 threads, and once they were all held every
route that needs a thread (uploads, the worker list) waited too. Here a request, the
reconciler or the search driver hands the job's id to :class:`PublishQueue` and goes on at
once; one thread of its own sends the messages in order, each bounded by
``ACE3_BROKER_TIMEOUT_SECONDS`` (``ace3_control.queue.publisher_config``). A publish that
fails, times out, or finds ``ACE3_PUBLISH_BACKLOG`` messages already waiting is logged and
left to the reconciler, which re-publishes queued jobs nobody claimed for
``ACE3_REPUBLISH_AFTER_SECONDS`` (a duplicate message finds the job claimed and does nothing).
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from ace3_control.queue import JobPublisher
from ace3_control.settings import Settings

logger = logging.getLogger(__name__)


class Publisher(Protocol):
    """What the API's request handlers and loops publish with: ``publish`` never blocks."""

    def publish(self, job_id: str) -> None: ...


class PublishQueue:
    """Sends job messages on one thread of its own, with at most ``backlog`` waiting."""

    def __init__(self, publisher: JobPublisher, backlog: int) -> None:
        self._publisher = publisher
        self._backlog = backlog
        self._waiting = 0
        self._lock = threading.Lock()
        # One thread: the publisher's connection is used by one thread only, messages go out
        # in the order they were handed over, and a frozen broker holds just this thread.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ace3-publish")

    @classmethod
    def from_settings(cls, settings: Settings) -> PublishQueue:
        return cls(JobPublisher(settings), settings.publish_backlog)

    @property
    def waiting(self) -> int:
        """Messages handed over and not sent (nor given up) yet."""
        return self._waiting

    def publish(self, job_id: str) -> None:
        """Hand the job's message to the publishing thread and return at once; a full backlog
        drops it (logged): the reconciler re-publishes the job."""
        with self._lock:
            if self._waiting >= self._backlog:
                logger.warning(
                    "job %s: %d messages already wait for the broker (ACE3_PUBLISH_BACKLOG); "
                    "the reconciler will publish it",
                    job_id,
                    self._waiting,
                )
                return
            self._waiting += 1
        try:
            self._executor.submit(self._send, job_id)
        except RuntimeError:  # closed: the API is shutting down
            self._sent()
            logger.warning("job %s: not published (shutting down); the reconciler will", job_id)

    def _send(self, job_id: str) -> None:
        try:
            self._publisher.publish(job_id)
        except Exception as exc:
            logger.warning(
                "could not publish job %s (%s: %s); the reconciler will re-publish it",
                job_id,
                type(exc).__name__,
                exc,
            )
        finally:
            self._sent()

    def _sent(self) -> None:
        with self._lock:
            self._waiting -= 1

    def close(self) -> None:
        """Drop what still waits (the reconciler has it) and close the broker connection once
        the publish in progress ends: at most a few ``ACE3_BROKER_TIMEOUT_SECONDS``."""
        self._executor.shutdown(wait=True, cancel_futures=True)
        self._publisher.close()
