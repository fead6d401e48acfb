"""The limits and timings of watching one running attempt, what a heartbeat learned
(:class:`Beat`), and the lease holder's heartbeat (:func:`renew_lease`).

The attempt's state itself is kept by the modules that write it: what the job's output told the
worker by the ingest (:class:`ace3_worker.ingest.JobOutput`), the run's lease, timers and
reasons to stop by the watch loop (:class:`ace3_worker.watch.RunState`), both held together by
:class:`ace3_worker.watch.AttemptWatch`; the outcome only reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session

from ace3_control import job_transitions
from ace3_control.settings import Settings

POLL_SECONDS = 0.25  # the watch loop's longest wait, and the first before a database retry
# The watch loop's shortest pass: a job that writes without pause is stored in batches.
MIN_PASS_SECONDS = 0.05
MAX_DB_RETRY_SECONDS = 5.0  # the longest wait between retries through a database outage
ERROR_TAIL_LINES = 40
MAX_NOTICES_PER_ATTEMPT = 200  # refused records past this are counted, not each logged
# The instability guard's and preemption's notices have a budget of their own (a job on
# instability action="warn" may fire often; it must not use up the refusals' notices).
MAX_GUARD_NOTICES_PER_ATTEMPT = 200
# Typed records (job_records: instability, preempted) stored per attempt; past this they are
# only counted (a job that writes them without end cannot flood the database).
MAX_TYPED_RECORDS_PER_ATTEMPT = 1000
# eval_samples records (up to ace3.config.events.MAX_LINE_BYTES each) kept per attempt, within
# the typed records' bound: the newest (each one past it replaces the attempt's oldest); one the
# typed records' bound leaves no room for is counted, and said once in the log.
MAX_EVAL_SAMPLE_RECORDS_PER_ATTEMPT = 100
# rank_failure records kept per attempt (the earliest; one a failing rank, so a bound only a
# job that writes its own ever reaches).
MAX_RANK_FAILURES_PER_ATTEMPT = 64


@dataclass(frozen=True)
class Beat:
    """What one heartbeat of a running attempt (or node) learned."""

    owned: bool  # the attempt still owns the job
    cancel_requested: bool
    trouble: str | None = None  # multi-node: why another node makes this one stop


def renew_lease(session: Session, job_id: str, attempt: int, settings: Settings) -> Beat:
    """Renew the job's lease for ``attempt`` and read its cancel flag, in ``session`` (the
    caller commits): the heartbeat of whoever holds the lease (a single-node attempt, the leader
    of a gang while it assembles, runs and collects the nodes' reports)."""
    row = session.execute(
        job_transitions.renew_lease(job_id, attempt, settings.lease_seconds)
    ).first()
    return Beat(owned=row is not None, cancel_requested=bool(row and row.cancel_requested))
