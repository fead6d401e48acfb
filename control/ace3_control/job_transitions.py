"""Every job state change as one conditional UPDATE, shared by the API and the worker.

Each statement names the states it may leave and, once a job is claimed, the attempt that owns
it (the fencing token): a duplicate message, a stale worker or a second API replica changes
nothing. Callers execute these with a sync or an async session alike and read ``rowcount`` or
the returned row.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Update, and_, or_, update

from ace3_control.models import ACTIVE_STATES, TERMINAL_STATES, Job, JobState, utcnow


def claim(job_id: str, worker_id: str, lease_seconds: float, now: datetime | None = None) -> Update:
    """queued -> starting, taking the next attempt number; returns (attempt, cancel_requested)."""
    now = now or utcnow()
    return (
        update(Job)
        .where(Job.id == job_id, Job.state == JobState.QUEUED, Job.cancel_requested.is_(False))
        .values(
            state=JobState.STARTING,
            attempt=Job.attempt + 1,
            worker_id=worker_id,
            lease_expires_at=now + timedelta(seconds=lease_seconds),
            heartbeat_at=now,
            exit_code=None,
            error=None,
            phase=None,
            updated_at=now,
        )
        .returning(Job.attempt)
    )


def mark_running(job_id: str, attempt: int) -> Update:
    return (
        update(Job)
        .where(Job.id == job_id, Job.attempt == attempt, Job.state == JobState.STARTING)
        .values(state=JobState.RUNNING, phase=None, started_at=utcnow(), updated_at=utcnow())
    )


def set_phase(job_id: str, attempt: int, phase: str | None) -> Update:
    """What a ``starting`` attempt is doing before its processes run (``"preparing_environment"``),
    or None once it is done; only while ``attempt`` owns the job."""
    return (
        update(Job)
        .where(Job.id == job_id, Job.attempt == attempt, Job.state.in_(ACTIVE_STATES))
        .values(phase=phase, updated_at=utcnow())
    )


def record_environment(job_id: str, attempt: int, environment_hash: str) -> Update:
    """The environment ``attempt`` prepared for the job (ace3_control.models.Environment)."""
    return (
        update(Job)
        .where(Job.id == job_id, Job.attempt == attempt, Job.state.in_(ACTIVE_STATES))
        .values(environment_hash=environment_hash, phase=None, updated_at=utcnow())
    )


def record_plan(job_id: str, attempt: int, plan: dict[str, Any]) -> Update:
    """The run plan of this attempt's start record (only while the attempt owns the job)."""
    return (
        update(Job)
        .where(Job.id == job_id, Job.attempt == attempt, Job.state.in_(ACTIVE_STATES))
        .values(plan=plan, updated_at=utcnow())
    )


def renew_lease(job_id: str, attempt: int, lease_seconds: float) -> Update:
    """Heartbeat; returns cancel_requested. No row back means the lease was lost: stop."""
    now = utcnow()
    return (
        update(Job)
        .where(Job.id == job_id, Job.attempt == attempt, Job.state.in_(ACTIVE_STATES))
        .values(heartbeat_at=now, lease_expires_at=now + timedelta(seconds=lease_seconds))
        .returning(Job.cancel_requested)
    )


def hold_attempt(job_id: str, attempt: int) -> Update:
    """Lock the job's row for the rest of the transaction while ``attempt`` still owns it.

    A row back means the writes that follow in the same transaction come from the owning
    attempt: a re-queue or finish by anyone else waits for the commit. No row back means the
    job belongs to another attempt (or ended): write nothing. Changes no value.
    """
    return (
        update(Job)
        .where(Job.id == job_id, Job.attempt == attempt, Job.state.in_(ACTIVE_STATES))
        .values(heartbeat_at=Job.heartbeat_at)
        .returning(Job.id)
    )


def finish(
    job_id: str,
    attempt: int,
    state: JobState,
    *,
    exit_code: int | None = None,
    error: str | None = None,
    final_metrics: dict[str, Any] | None = None,
    fine_tuned_model_id: str | None = None,
) -> Update:
    """The attempt's job to the terminal ``state`` while the attempt owns it; a succeeded run's
    registered export is ``fine_tuned_model_id`` (ace3_worker.export_registration)."""
    if state not in TERMINAL_STATES:
        raise ValueError(f"finish() needs a terminal state, not {state}")
    now = utcnow()
    return (
        update(Job)
        .where(Job.id == job_id, Job.attempt == attempt, Job.state.in_(ACTIVE_STATES))
        .values(
            state=state,
            exit_code=exit_code,
            error=error,
            final_metrics=final_metrics,
            fine_tuned_model_id=fine_tuned_model_id,
            finished_at=now,
            lease_expires_at=None,
            phase=None,
            updated_at=now,
        )
    )


def _requeue(job_id: str, attempt: int, reason: str, *conditions: Any, **values: Any) -> Update:
    """The attempt's job back to ``queued`` for the next attempt (while the attempt owns it and
    no cancel was asked), when ``conditions`` hold."""
    now = utcnow()
    return (
        update(Job)
        .where(
            Job.id == job_id,
            Job.attempt == attempt,
            Job.state.in_(ACTIVE_STATES),
            Job.cancel_requested.is_(False),
            *conditions,
        )
        .values(
            state=JobState.QUEUED,
            worker_id=None,
            lease_expires_at=None,
            enqueued_at=now,
            queued_at=now,
            error=reason,
            phase=None,
            updated_at=now,
            **values,
        )
    )


def within_retry_budget() -> Any:
    """The job's attempts so far leave room for a retry: out-of-memory halvings and
    preemptions do not use up ``max_retries``."""
    return Job.attempt <= Job.max_retries + Job.micro_batch_halvings + Job.preemptions


def requeue_for_retry(job_id: str, attempt: int, reason: str) -> Update:
    """An attempt died through no fault of the user's code: queue the next attempt, while the
    retry budget lasts (out-of-memory halvings and preemptions do not use it up)."""
    return _requeue(job_id, attempt, reason, within_retry_budget())


def requeue_after_preemption(
    job_id: str, attempt: int, reason: str, max_preemptions: int
) -> Update:
    """The attempt was preempted (its worker is draining): queue the next attempt, which
    resumes from the job's newest checkpoint, while fewer than ``max_preemptions`` were
    (``ACE3_MAX_PREEMPTIONS``: a fleet that keeps draining cannot re-queue a job forever). It
    does not use up the retry budget."""
    return _requeue(
        job_id,
        attempt,
        reason,
        Job.preemptions < max_preemptions,
        preemptions=Job.preemptions + 1,
    )


def requeue_with_half_the_micro_batch(
    job_id: str, attempt: int, reason: str, max_halvings: int
) -> Update:
    """An attempt ran out of memory inside a training step: queue the next one with twice the
    micro-batch split, while fewer than ``max_halvings`` (log2 of the per-rank micro-batch)
    were done. It does not use up the retry budget: ``max_halvings`` bounds it."""
    return _requeue(
        job_id,
        attempt,
        reason,
        Job.micro_batch_halvings < max_halvings,
        micro_batch_halvings=Job.micro_batch_halvings + 1,
    )


def cancel_queued(job_id: str) -> Update:
    """A job nobody runs yet is cancelled at once."""
    now = utcnow()
    return (
        update(Job)
        .where(Job.id == job_id, Job.state == JobState.QUEUED)
        .values(state=JobState.CANCELLED, cancel_requested=True, finished_at=now, updated_at=now)
    )


def request_cancel(job_id: str) -> Update:
    """A running job: raise the flag the supervisor watches."""
    now = utcnow()
    return (
        update(Job)
        .where(Job.id == job_id, Job.state.in_(ACTIVE_STATES))
        .values(state=JobState.CANCELLING, cancel_requested=True, updated_at=now)
    )


def mark_republished(job_id: str, enqueued_before: datetime) -> Update:
    return (
        update(Job)
        .where(Job.id == job_id, Job.state == JobState.QUEUED, Job.enqueued_at < enqueued_before)
        .values(enqueued_at=utcnow())
    )


def mark_handed_back(job_id: str) -> Update:
    """A worker that cannot run a queued job publishes it again: the reconciler, which
    re-publishes jobs whose ``enqueued_at`` is stale, need not add a copy of its own."""
    return (
        update(Job)
        .where(Job.id == job_id, Job.state == JobState.QUEUED)
        .values(enqueued_at=utcnow())
    )


def fail_queued(job_id: str, error: str) -> Update:
    """A queued job no live worker can run (after waiting ``ACE3_UNSCHEDULABLE_AFTER_SECONDS``)."""
    now = utcnow()
    return (
        update(Job)
        .where(Job.id == job_id, Job.state == JobState.QUEUED)
        .values(state=JobState.FAILED, error=error, finished_at=now, updated_at=now)
    )


def expired_lease_condition(now: datetime) -> Any:
    return and_(
        Job.state.in_(ACTIVE_STATES),
        or_(Job.lease_expires_at.is_(None), Job.lease_expires_at < now),
    )
