"""The gang of a multi-node job: its ``job_nodes`` rows, the statements that change them, and the
decisions taken from them (shared by every worker of the gang; the tests call them directly).

A job with ``num_nodes = N`` runs each attempt on N different workers. The worker that claims the
queued job (``job_transitions.claim``) becomes node 0, the leader; the others join the claimed
attempt by inserting the lowest free node rank (the primary key ``(job_id, attempt, node_rank)``
and the unique ``(job_id, attempt, worker_id)`` make a slot one worker's, and a worker one
slot's). Nothing is launched until all N slots are held: then the leader writes the rendezvous
endpoint on its row and moves the job to ``running`` in one transaction, and every node launches
its torchrun. Every node heartbeats its row; a node silent for ``lost_after`` is gone. When its
torchrun ends, a node reports its exit on its row; the leader then reads every report and
decides the attempt (:func:`attempt_verdict`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from sqlalchemy import Delete, Insert, Select, Update, delete, select, update

from ace3.errors import OUT_OF_MEMORY_EXIT_CODE
from ace3_control.db import insert_ignoring_duplicates
from ace3_control.models import Job, JobNode, JobState, NodeState, utcnow

LIVE_NODE_STATES = (NodeState.WAITING, NodeState.RUNNING)


def nodes_of(config: Mapping[str, Any] | None) -> int:
    """``num_nodes`` of a job's stored config (1 when absent)."""
    return max(1, int((config or {}).get("num_nodes", 1) or 1))


# -- statements ---------------------------------------------------------------------------------
def add_node(
    dialect_name: str,
    *,
    job_id: str,
    attempt: int,
    node_rank: int,
    worker_id: str,
    process: str,
    host: str,
) -> Insert:
    """Take slot ``node_rank`` for ``worker_id``; no row inserted means the slot is taken, or
    this worker holds another slot of the attempt already."""
    now = utcnow()
    row = {
        "job_id": job_id,
        "attempt": attempt,
        "node_rank": node_rank,
        "worker_id": worker_id,
        "process": process[:255],
        "host": host[:255],
        "state": NodeState.WAITING,
        "heartbeat_at": now,
        "created_at": now,
    }
    return insert_ignoring_duplicates(dialect_name, JobNode.__table__, [row])


def members(job_id: str, attempt: int) -> Select[JobNode]:
    return (
        select(JobNode)
        .where(JobNode.job_id == job_id, JobNode.attempt == attempt)
        .order_by(JobNode.node_rank)
    )


def slot_of(job_id: str, attempt: int, worker_id: str) -> Select[int]:
    """The node rank ``worker_id`` holds in the attempt, if any."""
    return select(JobNode.node_rank).where(
        JobNode.job_id == job_id, JobNode.attempt == attempt, JobNode.worker_id == worker_id
    )


def _one(job_id: str, attempt: int, node_rank: int, worker_id: str) -> Any:
    return (
        (JobNode.job_id == job_id)
        & (JobNode.attempt == attempt)
        & (JobNode.node_rank == node_rank)
        & (JobNode.worker_id == worker_id)
    )


def touch(job_id: str, attempt: int, node_rank: int, worker_id: str) -> Update:
    """A node's heartbeat; no row back means the slot is no longer this worker's (the leader
    dropped it as silent): leave."""
    return (
        update(JobNode)
        .where(_one(job_id, attempt, node_rank, worker_id), JobNode.state.in_(LIVE_NODE_STATES))
        .values(heartbeat_at=utcnow())
        .returning(JobNode.node_rank)
    )


def drop_silent_waiting(job_id: str, attempt: int, silent_since: datetime) -> Delete:
    """While the gang assembles: free the slots of waiting workers that stopped heartbeating
    (they died), so another worker can take them."""
    return delete(JobNode).where(
        JobNode.job_id == job_id,
        JobNode.attempt == attempt,
        JobNode.node_rank > 0,
        JobNode.state == NodeState.WAITING,
        JobNode.heartbeat_at < silent_since,
    )


def hold_starting(job_id: str, attempt: int) -> Update:
    """Lock the job's row while ``attempt`` is still assembling its gang (``starting``): a join
    and the leader's launch or give-up serialise on it. No row back: the gang is closed."""
    return (
        update(Job)
        .where(Job.id == job_id, Job.attempt == attempt, Job.state == JobState.STARTING)
        .values(heartbeat_at=Job.heartbeat_at)
        .returning(Job.id)
    )


def open_rendezvous(job_id: str, attempt: int, endpoint: str) -> Update:
    """The leader's go: every node launches torchrun against ``endpoint`` (``host:port``)."""
    return (
        update(JobNode)
        .where(JobNode.job_id == job_id, JobNode.attempt == attempt, JobNode.node_rank == 0)
        .values(endpoint=endpoint, state=NodeState.RUNNING, heartbeat_at=utcnow())
    )


def mark_launched(job_id: str, attempt: int, node_rank: int, worker_id: str) -> Update:
    return (
        update(JobNode)
        .where(_one(job_id, attempt, node_rank, worker_id), JobNode.state == NodeState.WAITING)
        .values(state=NodeState.RUNNING, heartbeat_at=utcnow())
    )


def report_exit(
    job_id: str,
    attempt: int,
    node_rank: int,
    worker_id: str,
    *,
    exit_code: int,
    error: str | None,
    stopped: str | None,
    final_metrics: dict[str, Any] | None,
) -> Update:
    now = utcnow()
    return (
        update(JobNode)
        .where(_one(job_id, attempt, node_rank, worker_id))
        .values(
            state=NodeState.EXITED,
            exit_code=exit_code,
            error=error,
            stopped=stopped,
            final_metrics=final_metrics,
            heartbeat_at=now,
            finished_at=now,
        )
    )


def leave(job_id: str, attempt: int, node_rank: int, worker_id: str) -> Update:
    """A node that never launched releases its slot (its row stays, as ``left``)."""
    return (
        update(JobNode)
        .where(_one(job_id, attempt, node_rank, worker_id), JobNode.state == NodeState.WAITING)
        .values(state=NodeState.LEFT, finished_at=utcnow())
    )


def leave_all(job_id: str, attempt: int) -> Update:
    """The leader gives the gang up: every waiting slot is released."""
    return (
        update(JobNode)
        .where(
            JobNode.job_id == job_id,
            JobNode.attempt == attempt,
            JobNode.state == NodeState.WAITING,
        )
        .values(state=NodeState.LEFT, finished_at=utcnow())
    )


# -- decisions ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeReport:
    """One node as its row says (detached from the session)."""

    node_rank: int
    worker_id: str
    process: str
    state: str
    heartbeat_at: datetime
    exit_code: int | None = None
    error: str | None = None
    stopped: str | None = None
    final_metrics: dict[str, Any] | None = None
    finished_at: datetime | None = None

    @classmethod
    def of(cls, row: JobNode) -> NodeReport:
        return cls(
            row.node_rank,
            row.worker_id,
            row.process,
            row.state,
            row.heartbeat_at,
            row.exit_code,
            row.error,
            row.stopped,
            row.final_metrics,
            row.finished_at,
        )

    @property
    def label(self) -> str:
        return f"node {self.node_rank} (worker {self.process})"

    def silent(self, now: datetime, lost_after: float) -> bool:
        """Still supposed to heartbeat, and has not for ``lost_after`` seconds."""
        return self.state in LIVE_NODE_STATES and now - self.heartbeat_at > timedelta(
            seconds=lost_after
        )


def waiting_count(nodes: Sequence[NodeReport]) -> int:
    return sum(node.state == NodeState.WAITING for node in nodes)


def gang_timeout_error(needed: int, came: int, waited_seconds: float) -> str:
    """The job's error when the gang never completed."""
    return (
        f"needed {needed} workers for num_nodes={needed}, only {came} came within "
        f"{waited_seconds:g} s (ACE3_GANG_WAIT_SECONDS): a multi-node job starts only when "
        f"{needed} different live workers that fit num_gpus are free at once; add workers, "
        "free them, or lower num_nodes"
    )


def peer_trouble(
    nodes: Sequence[NodeReport], me: int, needed: int, now: datetime, lost_after: float
) -> str | None:
    """Why this node (rank ``me``) must stop its running processes because of another node: a
    peer's torchrun failed or was stopped, a peer left, or a peer's worker went silent."""
    present = {node.node_rank for node in nodes}
    missing = sorted(set(range(needed)) - present)
    if missing:
        return f"node {missing[0]} is no longer part of the attempt"
    for node in nodes:
        if node.node_rank == me:
            continue
        if node.state == NodeState.EXITED and node.exit_code != 0:
            return f"{node.label} ended with exit code {node.exit_code}"
        if node.state == NodeState.LEFT:
            return f"{node.label} left the attempt"
        if node.silent(now, lost_after):
            return f"{node.label} stopped heartbeating (its worker is gone)"
    return None


# out_of_memory: a rank ran out of memory inside a training step (its node reported the engine's
# OUT_OF_MEMORY_EXIT_CODE): the next attempt halves the micro-batch.
Outcome = Literal["succeeded", "failed", "cancelled", "retry", "out_of_memory"]

# What a rank's error says when it only saw another node's processes die (gloo, NCCL, the
# c10d store): such a node is a consequence, not the cause, when another one failed too.
_PEER_SYMPTOMS = (
    "connection closed by peer",
    "connection reset by peer",
    "caused by a remote worker crashing",
    "communicator was aborted",
    "distnetworkerror",
    "broken pipe",
)


def echoes_a_peer(error: str | None) -> bool:
    """Whether a node's error looks like the echo of another node's death."""
    text = (error or "").lower()
    return any(symptom in text for symptom in _PEER_SYMPTOMS)


@dataclass(frozen=True)
class Verdict:
    """How one multi-node attempt ended, for the leader to record."""

    outcome: Outcome
    error: str | None = None
    exit_code: int | None = None
    final_metrics: dict[str, Any] | None = None


def attempt_verdict(
    nodes: Sequence[NodeReport], *, needed: int, attempt: int, cancel_requested: bool
) -> Verdict:
    """The attempt's outcome from every node's report (after each reported or went silent).

    A cancel wins. Then infrastructure before code: a node that never reported (its worker
    died) or whose torchrun was killed by a signal the service did not send re-queues the job
    (``retry``, while retries last). Then the first node to fail on its own (not stopped by the
    service because of another node) fails the job with its error; one whose ranks only saw a
    peer's processes die (``Connection closed by peer``...) counts after the others, since two
    nodes can report nearly at once. All exits 0: succeeded, with the final metrics of the node
    that hosted rank 0.
    """
    final_metrics = next((n.final_metrics for n in nodes if n.final_metrics is not None), None)
    leader_code = next((n.exit_code for n in nodes if n.node_rank == 0), None)
    if cancel_requested:
        return Verdict("cancelled", None, leader_code, final_metrics)
    reported = [node for node in nodes if node.state == NodeState.EXITED]
    silent = [node for node in nodes if node.state != NodeState.EXITED]
    if silent or len(nodes) < needed:
        who = silent[0].label if silent else "a node"
        return Verdict("retry", f"{who} stopped reporting during attempt {attempt}")
    killed = [n for n in reported if (n.exit_code or 0) < 0 and n.stopped is None]
    if killed:
        node = killed[0]
        return Verdict(
            "retry",
            f"the torchrun process of {node.label} was killed by signal {-(node.exit_code or 0)}",
        )
    far = datetime.max.replace(tzinfo=UTC)
    failed = sorted(
        (n for n in reported if n.exit_code != 0 and n.stopped is None),
        key=lambda n: (echoes_a_peer(n.error), n.finished_at or far, n.node_rank),
    )
    if failed:
        node = failed[0]
        error = f"{node.label}: {node.error or f'exited with code {node.exit_code}'}"
        outcome: Outcome = (
            "out_of_memory" if node.exit_code == OUT_OF_MEMORY_EXIT_CODE else "failed"
        )
        return Verdict(outcome, error[:8000], node.exit_code, final_metrics)
    stopped = [n for n in reported if n.exit_code != 0]
    if stopped:
        reasons = "; ".join(f"{n.label} was stopped: {n.stopped}" for n in stopped)
        return Verdict("retry", f"attempt {attempt} was stopped: {reasons}")
    return Verdict("succeeded", None, 0, final_metrics)
