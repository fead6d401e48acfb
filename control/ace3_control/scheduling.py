"""The fair queue: which queued job a worker claims next, and why a queued job waits.

One order, used by the workers' claims and by the API's queue positions alike
(:func:`queue_line`):

1. ``priority`` (high, normal, low);
2. the owner's *turn*: how many of the owner's jobs hold a worker now, plus how many of the
   owner's queued jobs of the same priority are ahead of this one (so owners alternate: an owner
   with 50 queued jobs does not starve one with 1);
3. the owner served longest ago first (``owners.last_claimed_at``, never served first);
4. the oldest ``queued_at``, then the id.

A job whose owner is at a quota (``owners.max_running_jobs``, ``owners.max_gpus``: processes of
the owner's jobs that hold a worker) is skipped and waits; it is never failed for it.

A worker that receives a Celery message claims the first job of that order that fits it
(:func:`claim_next`), not necessarily the message's: the message of the job it claimed is still
on its way, and serves the one it passed over (the reconciler re-publishes any queued job whose
message is lost). Claims of one owner are serialised on the owner's row, so a quota holds
under concurrent claims; the job's row is taken with ``FOR UPDATE SKIP LOCKED``.

Gangs (multi-node jobs): a worker first joins the oldest gang still assembling that it fits
(:func:`oldest_open_gang`), and leads a new one only while no gang it could join is assembling
(checked under a transaction-scoped advisory lock on Postgres), so two gangs never hold half of
the workers each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import Subquery, and_, case, func, or_, select, text, update
from sqlalchemy.orm import Session, aliased

from ace3_control import job_transitions
from ace3_control.capacity import HasCapacity, JobNeeds, fit_problem
from ace3_control.job_nodes import nodes_of
from ace3_control.models import (
    ACTIVE_STATES,
    Job,
    JobNode,
    JobPriority,
    JobState,
    NodeState,
    Owner,
    utcnow,
)

WaitingReason = Literal["quota", "capacity", "priority"]
PRIORITY_RANK = {JobPriority.HIGH: 0, JobPriority.NORMAL: 1, JobPriority.LOW: 2}
CANDIDATES = 50  # jobs of the order a worker considers per message
GANG_LOCK = 0x61636533  # pg_advisory_xact_lock key of gang leads ("ace3")


def _active() -> Any:
    return aliased(Job, name="active")


def running_jobs(owner_id: Any) -> Any:
    """The owner's jobs that hold a worker now (a correlated scalar subquery)."""
    active = _active()
    return (
        select(func.count())
        .where(active.owner_id == owner_id, active.state.in_(ACTIVE_STATES))
        .scalar_subquery()
    )


def running_processes(owner_id: Any) -> Any:
    """The processes of the owner's jobs that hold a worker now."""
    active = _active()
    return (
        select(func.coalesce(func.sum(active.num_processes), 0))
        .where(active.owner_id == owner_id, active.state.in_(ACTIVE_STATES))
        .scalar_subquery()
    )


def over_quota(running: Any, processes: Any, num_processes: Any) -> Any:
    """The owner's limits would be exceeded by one more job of ``num_processes``."""
    return or_(
        and_(Owner.max_running_jobs.is_not(None), running >= Owner.max_running_jobs),
        and_(Owner.max_gpus.is_not(None), processes + num_processes > Owner.max_gpus),
    )


def queue_line() -> Subquery:
    """Every queued job in claim order: the job's columns plus ``over_quota`` (1/0) and
    ``position`` (1 = next)."""
    running = running_jobs(Job.owner_id)
    processes = running_processes(Job.owner_id)
    rank = case(
        *[(Job.priority == name.value, value) for name, value in PRIORITY_RANK.items()],
        else_=PRIORITY_RANK[JobPriority.NORMAL],
    )
    ahead_of_it = func.row_number().over(
        partition_by=(Job.owner_id, Job.priority), order_by=(Job.queued_at, Job.id)
    )
    inner = (
        select(
            Job.id,
            Job.owner_id,
            Job.name,
            Job.priority,
            Job.num_processes,
            Job.config,
            Job.created_at,
            Job.queued_at,
            Job.enqueued_at,
            rank.label("priority_rank"),
            (ahead_of_it - 1 + running).label("turn"),
            Owner.last_claimed_at.label("served_at"),
            case((over_quota(running, processes, Job.num_processes), 1), else_=0).label(
                "over_quota"
            ),
        )
        .join(Owner, Owner.id == Job.owner_id)
        .where(Job.state == JobState.QUEUED)
        .subquery()
    )
    position = func.row_number().over(
        order_by=(
            inner.c.priority_rank,
            inner.c.turn,
            inner.c.served_at.is_not(None),  # never served first (portable NULLS FIRST)
            inner.c.served_at,
            inner.c.queued_at,
            inner.c.id,
        )
    )
    return select(inner, position.label("position")).subquery()


@dataclass(frozen=True)
class Claimed:
    """The job a worker claimed: its new attempt, and how many nodes it runs on."""

    job_id: str
    attempt: int
    nodes: int


def _owner_over_quota(session: Session, owner_id: str, num_processes: int) -> bool:
    """Locks the owner's row (claims of one owner serialise on it) and checks its quotas. On
    SQLite, where ``FOR UPDATE`` means nothing, a no-op write to the owner's row takes the
    database's write lock first, so the count below is read inside the claim's write
    transaction (two slots of one worker would otherwise both count the owner below quota)."""
    if not _is_postgres(session):
        session.execute(
            update(Owner).where(Owner.id == owner_id).values(last_claimed_at=Owner.last_claimed_at)
        )
    limits = session.execute(
        select(Owner.max_running_jobs, Owner.max_gpus).where(Owner.id == owner_id).with_for_update()
    ).first()
    if limits is None or (limits.max_running_jobs is None and limits.max_gpus is None):
        return False
    running, processes = session.execute(
        select(func.count(), func.coalesce(func.sum(Job.num_processes), 0)).where(
            Job.owner_id == owner_id, Job.state.in_(ACTIVE_STATES)
        )
    ).one()
    if limits.max_running_jobs is not None and running >= limits.max_running_jobs:
        return True
    return limits.max_gpus is not None and processes + num_processes > limits.max_gpus


def _gang_lock(session: Session) -> None:
    """Serialise gang leads across workers (Postgres; SQLite serialises every write anyway)."""
    if _is_postgres(session):
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": GANG_LOCK})


def claim_next(
    session: Session,
    capacity: HasCapacity | None,
    worker_id: str,
    lease_seconds: float,
    node_id: str | None = None,
    message_job_id: str | None = None,
) -> Claimed | None:
    """Claim the first queued job of the fair order that fits ``capacity`` and its owner's
    quota (``queued -> starting``) for ``worker_id`` (the claiming process; ``node_id``: the
    worker as gangs know it, default the same; ``message_job_id``: the job the message named).
    The caller commits (after adding a gang's node 0 row), or rolls back on None."""
    line = queue_line()
    columns = select(line.c.id, line.c.owner_id, line.c.num_processes, line.c.config).where(
        line.c.over_quota == 0
    )
    rows = list(session.execute(columns.order_by(line.c.position).limit(CANDIDATES)).all())
    if message_job_id is not None and all(row.id != message_job_id for row in rows):
        # Past the first CANDIDATES (all of them too large for this worker, say): the message's
        # own job is tried last, so a job that fits here is never starved by ones that do not.
        rows += session.execute(columns.where(line.c.id == message_job_id)).all()
    gang_node = node_id or worker_id
    for row in rows:
        needs = JobNeeds.from_job(int(row.num_processes), row.config)
        if capacity is not None and fit_problem(needs, capacity) is not None:
            continue
        # Each try in a savepoint (Postgres): a skipped owner's row lock goes with it, so a claim
        # never waits for one owner's lock while holding another's (no deadlock between workers).
        point = session.begin_nested() if _is_postgres(session) else None
        attempt = _try_claim(session, row, needs, capacity, worker_id, gang_node, lease_seconds)
        if point is not None:
            (point.rollback if attempt is None else point.commit)()
        if attempt is not None:
            return Claimed(row.id, attempt, nodes_of(row.config))
    return None


def _is_postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def _try_claim(
    session: Session,
    row: Any,
    needs: JobNeeds,
    capacity: HasCapacity | None,
    worker_id: str,
    gang_node: str,
    lease_seconds: float,
) -> int | None:
    """Claim one candidate within its owner's quota: the new attempt, or None (skipped)."""
    if needs.nodes > 1:
        _gang_lock(session)
        if oldest_open_gang(session, capacity, gang_node) is not None:
            return None  # fill the assembling gang first; never start a second half-gang
    if _owner_over_quota(session, row.owner_id, int(row.num_processes)):
        return None
    free = session.scalar(
        select(Job.id)
        .where(Job.id == row.id, Job.state == JobState.QUEUED)
        .with_for_update(skip_locked=True)
    )
    if free is None:
        return None  # another worker is claiming it
    claimed = session.execute(job_transitions.claim(row.id, worker_id, lease_seconds)).first()
    if claimed is None:
        return None
    session.execute(update(Owner).where(Owner.id == row.owner_id).values(last_claimed_at=utcnow()))
    return int(claimed.attempt)


def oldest_open_gang(
    session: Session, capacity: HasCapacity | None, worker_id: str
) -> tuple[str, int, int] | None:
    """The oldest multi-node attempt still assembling (its leader waits, slots are free) that
    this worker fits and holds no slot of: ``(job_id, attempt, nodes)``, or None."""
    leader = aliased(JobNode, name="leader")
    rows = session.execute(
        select(Job.id, Job.attempt, Job.num_processes, Job.config)
        .join(
            leader,
            and_(leader.job_id == Job.id, leader.attempt == Job.attempt, leader.node_rank == 0),
        )
        .where(
            Job.state == JobState.STARTING,
            Job.cancel_requested.is_(False),
            leader.state == NodeState.WAITING,
        )
        .order_by(leader.created_at, Job.id)
        .limit(CANDIDATES)
    ).all()
    for row in rows:
        needs = JobNeeds.from_job(int(row.num_processes), row.config)
        if capacity is not None and fit_problem(needs, capacity) is not None:
            continue
        taken = session.execute(
            select(func.count(), func.count().filter(JobNode.worker_id == worker_id)).where(
                JobNode.job_id == row.id,
                JobNode.attempt == row.attempt,
                JobNode.state.in_((NodeState.WAITING, NodeState.RUNNING)),
            )
        ).one()
        if taken[1] == 0 and taken[0] < needs.nodes:
            return str(row.id), int(row.attempt), needs.nodes
    return None


def first_queued_of(owner_id: str) -> Any:
    """The id of the owner's first queued job in claim order, when the owner has a quota (a
    job of theirs ending may let it run now: the worker publishes a message for it)."""
    line = queue_line()
    return (
        select(line.c.id)
        .join(Owner, Owner.id == line.c.owner_id)
        .where(
            line.c.owner_id == owner_id,
            or_(Owner.max_running_jobs.is_not(None), Owner.max_gpus.is_not(None)),
        )
        .order_by(line.c.position)
        .limit(1)
    )


def waiting_line() -> Subquery:
    """:func:`queue_line` with each job's ``waiting_reason``: ``quota`` (its owner is at a
    limit), ``priority`` (jobs that may run are ahead of it), ``capacity`` (it is next, and waits
    for a free worker that fits it)."""
    line = queue_line()
    claimable_through = func.sum(1 - line.c.over_quota).over(order_by=line.c.position)
    inner = select(line, claimable_through.label("claimable_through")).subquery()
    reason = case(
        (inner.c.over_quota == 1, "quota"),
        (inner.c.claimable_through > 1, "priority"),
        else_="capacity",
    )
    return select(inner, reason.label("waiting_reason")).subquery()


async def queue_status(session: Any, job_id: str) -> tuple[int | None, WaitingReason | None]:
    """A queued job's ``position`` in claim order and its ``waiting_reason`` (:func:`waiting_line`);
    (None, None) for a job that is not queued. ``session`` is an async session."""
    line = waiting_line()
    row = (
        await session.execute(
            select(line.c.position, line.c.waiting_reason).where(line.c.id == job_id)
        )
    ).first()
    if row is None:
        return None, None
    return int(row.position), row.waiting_reason
