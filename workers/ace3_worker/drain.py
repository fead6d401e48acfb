"""Draining a worker: SIGTERM to ``ace3 worker`` (a spot-instance notice, a scale-down, a
deploy) preempts the attempts it runs instead of waiting for them to end.

Celery answers SIGTERM with a warm shutdown: its main process stops consuming (no new job is
claimed) and waits for the running tasks. Its ``worker_shutting_down`` signal sets
:data:`DRAIN`, an event shared with the pool's processes (made before the pool forks them);
each attempt's watch loop (:mod:`ace3_worker.watch`) sees it and preempts its attempt: SIGTERM to
torchrun, which passes it to the ranks; they finish their step, agree on it, write a checkpoint
and leave (:mod:`ace3.runtime.loop.preemption`). The worker stores and verifies that checkpoint like
any other, re-queues the job (``job_transitions.requeue_after_preemption``: the job's
``preemptions`` + 1, not a retry) and the task ends; when every task has ended, the worker
exits. The next attempt, on any worker, resumes from the job's newest verified checkpoint.

The ranks have :func:`grace_seconds` for it; then SIGKILL, and the job is re-queued all the same
(from its newest checkpoint stored before). Multi-node attempts are not preempted: they run to
their end (``preemption_grace_seconds`` is refused for them).
"""

from __future__ import annotations

import logging
import multiprocessing
from typing import Any

from ace3_control.settings import Settings

logger = logging.getLogger(__name__)

# Set once, in the worker's main process, when it starts shutting down; read by every slot.
DRAIN = multiprocessing.get_context("fork").Event()


def request_drain(reason: str) -> None:
    if not DRAIN.is_set():
        logger.warning("ace3 worker: draining (%s): running attempts are preempted", reason)
    DRAIN.set()


def draining() -> bool:
    return DRAIN.is_set()


def shutdown_timeout(settings: Settings) -> float:
    """torchrun's ``--shutdown-timeout``: longer than any grace this worker gives (so torchrun
    waits for ranks that checkpoint) and no longer (a rank stuck after torchrun stopped the
    others on its own, after a rank failed, is killed as soon)."""
    return max(settings.cancel_grace_seconds, settings.worker_drain_grace_seconds) + 5.0


def grace_seconds(config: dict[str, Any], settings: Settings) -> float:
    """How long a preempted attempt's ranks have before SIGKILL: the job's
    ``preemption_grace_seconds`` when it set one, capped by the worker's
    ``ACE3_WORKER_DRAIN_GRACE_SECONDS`` (the machine may not wait longer); else the worker's."""
    limit = settings.worker_drain_grace_seconds
    asked = config.get("preemption_grace_seconds")
    if isinstance(asked, int | float) and not isinstance(asked, bool) and asked > 0:
        return min(float(asked), limit)
    return limit
