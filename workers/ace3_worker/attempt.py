"""What the worker tracks about one running attempt (:class:`AttemptWatch`): why it is being
stopped, the lease, the ranks' last stderr lines, and what was read but not yet stored.

The watch loop (:mod:`ace3_worker.watch`), the ingest (:mod:`ace3_worker.ingest`) and the
outcome (:mod:`ace3_worker.outcome`) read and write it; it holds no behaviour of its own.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from ace3.config.events import EventRecord, RefusedRecord, RunPlan
from ace3_worker import reports

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


@dataclass
class PendingRecord:
    """An events record read but not yet stored, with what reading it decided."""

    record: EventRecord | RefusedRecord
    checkpoint: reports.StagedCheckpoint | None = None  # a valid checkpoint, copied to the store
    notice: str | None = None  # the warning for the job's log
    plan: RunPlan | None = None  # an accepted start record's plan, for the job row
    typed: bool = False  # an instability or preempted record to store in job_records


@dataclass
class AttemptWatch:
    """What the supervisor tracks while the ranks run."""

    job_id: str
    attempt: int
    # The ranks' own stderr (user tracebacks) apart from torchrun's, which only summarises them.
    rank_stderr_tail: deque[tuple[int, str]] = field(
        default_factory=lambda: deque(maxlen=ERROR_TAIL_LINES)
    )
    launcher_stderr_tail: deque[str] = field(default_factory=lambda: deque(maxlen=ERROR_TAIL_LINES))
    cancel_requested: bool = False
    lease_lost: bool = False
    # Multi-node: why another node made this one stop (its failure, its silence).
    peer_trouble: str | None = None
    # Why the service stopped the attempt on its own (max_runtime_seconds).
    stopped_for: str | None = None
    # Why this worker preempted the attempt (it is draining: ace3_worker.drain), and the grace
    # its ranks have to checkpoint before SIGKILL. Only single-node attempts are preempted.
    preemptible: bool = True
    preempted_for: str | None = None
    preemption_grace: float | None = None
    # Whether this worker syncs the artifacts: the node that hosts rank 0 (the only one on a
    # single-node job; on a multi-node job, the node whose torchrun prints rank 0's lines).
    syncs_artifacts: bool = True
    started_at: float = field(default_factory=time.monotonic)
    terminate_sent_at: float | None = None
    killed: bool = False
    # Drained but not yet stored (the database was unreachable): retried on the next pass.
    pending_lines: list[reports.LogLine] = field(default_factory=list)
    pending_records: list[PendingRecord] = field(default_factory=list)
    # Checkpoint files already copied into the store (a repeated record is not copied again).
    staged_checkpoints: set[str] = field(default_factory=set)
    notices_left: int = MAX_NOTICES_PER_ATTEMPT
    guard_notices_left: int = MAX_GUARD_NOTICES_PER_ATTEMPT
    typed_records_left: int = MAX_TYPED_RECORDS_PER_ATTEMPT
    typed_records_dropped: int = 0  # past the bound: counted, not stored
    lease_renewed_at: float = field(default_factory=time.monotonic)

    @property
    def stopping(self) -> bool:
        """Whether the service wants the attempt's processes gone (lease lost, cancel, a peer
        node's trouble)."""
        return self.lease_lost or self.cancel_requested or self.peer_trouble is not None
