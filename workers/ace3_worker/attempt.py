"""The limits and timings of watching one running attempt, and what a heartbeat learned
(:class:`Beat`).

The attempt's state itself is kept by the modules that write it: what the job's output told the
worker by the ingest (:class:`ace3_worker.ingest.JobOutput`), the run's lease, timers and
reasons to stop by the watch loop (:class:`ace3_worker.watch.RunState`), both held together by
:class:`ace3_worker.watch.AttemptWatch`; the outcome only reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class Beat:
    """What one heartbeat of a running attempt (or node) learned."""

    owned: bool  # the attempt still owns the job
    cancel_requested: bool
    trouble: str | None = None  # multi-node: why another node makes this one stop
