"""A worker's part in assembling a multi-node job: take a node slot, wait for the whole gang.
What a node does once torchrun runs (heartbeat, watch the other nodes, report its exit, the
leader's verdict) is :mod:`ace3_worker.gang_node`.

The rows and the decisions are in ``ace3_control.job_nodes``; this module runs them against the
database from one supervisor process. The leader (node 0, the worker that claimed the queued job)
publishes one message per missing node, renews the job's lease while it waits, and after
``ACE3_GANG_WAIT_SECONDS`` without a full gang fails the job (never starting torchrun on part of
it). A joining worker holds its slot by heartbeating it until the leader's go (the rendezvous
endpoint on node 0's row, the job ``running``), or leaves when the attempt ends. Each waiting
node keeps its Celery slot meanwhile.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import Row, select
from sqlalchemy.orm import Session, sessionmaker

from ace3_control import job_nodes, job_transitions, scheduling
from ace3_control.capacity import Capacity
from ace3_control.db import rows_changed
from ace3_control.models import Job, JobNode, JobState, utcnow
from ace3_control.settings import Settings
from ace3_worker.attempt import renew_lease
from ace3_worker.messages import RecentCopies, publish

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.5


@dataclass
class NodeSeat:
    """The node slot this worker holds in one attempt of a multi-node job."""

    job_id: str
    attempt: int
    node_rank: int
    nodes: int
    endpoint: str | None = None
    taken_at: float = field(default_factory=time.monotonic)

    @property
    def is_leader(self) -> bool:
        return self.node_rank == 0

    @property
    def rendezvous_id(self) -> str:
        return f"{self.job_id}-{self.attempt}"


def free_port() -> int:
    """A TCP port free on every interface right now (torchrun's rendezvous store binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def rendezvous_endpoint(host: str, port: int) -> str:
    """``host:port`` as torchrun reads it (an IPv6 address in brackets)."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def node_reports(session: Session, seat: NodeSeat) -> list[job_nodes.NodeReport]:
    """Every node row of the seat's attempt."""
    rows = session.scalars(job_nodes.members(seat.job_id, seat.attempt)).all()
    return [job_nodes.NodeReport.of(row) for row in rows]


def seat_job(session: Session, seat: NodeSeat) -> Row[str, int, bool] | None:
    """The job's state, attempt and cancel flag, as a node that holds no lease (a follower)
    reads them."""
    return session.execute(
        select(Job.state, Job.attempt, Job.cancel_requested).where(Job.id == seat.job_id)
    ).first()


class GangMember:
    """One supervisor process acting for its worker (``worker_id``, the registry id shared by
    the worker's slots) in multi-node jobs. It lives as long as the worker process: it
    remembers which copies of a job's message it passed on."""

    def __init__(
        self,
        settings: Settings,
        sessions: sessionmaker[Session],
        *,
        worker_id: str,
        process: str,
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.worker_id = worker_id
        self.process = process
        self.host = settings.resolved_worker_advertise_host
        self.passed_on = RecentCopies()

    @property
    def lost_after(self) -> float:
        """A node silent this long is gone (its worker died)."""
        return self.settings.lease_seconds

    # -- taking a slot: the supervisor's claim (the oldest open gang first, else the fair order) --
    def join_oldest(self, capacity: Capacity) -> NodeSeat | None:
        """Join the oldest gang still assembling that this worker fits (``capacity``: what it
        has free now) and is not part of (None: none)."""
        with self.sessions() as session:
            oldest = scheduling.oldest_open_gang(session, capacity, self.worker_id)
        return None if oldest is None else self._join(*oldest)

    def add_leader(self, session: Session, job_id: str, attempt: int) -> None:
        """Node 0's row of an attempt this worker claimed (in the claim's transaction)."""
        session.execute(self._add(session, job_id, attempt, 0))

    def led(self, job_id: str, attempt: int, nodes: int) -> NodeSeat:
        """The leader's seat of a claimed attempt (node 0 added): ask for the other nodes."""
        logger.info(
            "job %s attempt %d: leading a gang of %d nodes; waiting up to %g s for %d more "
            "worker(s)",
            job_id,
            attempt,
            nodes,
            self.settings.gang_wait_seconds,
            nodes - 1,
        )
        self.publish_copies(job_id, nodes - 1)
        return NodeSeat(job_id, attempt, 0, nodes)

    def _join(self, job_id: str, attempt: int, nodes: int) -> NodeSeat | None:
        with self.sessions() as session:
            held = session.scalar(job_nodes.slot_of(job_id, attempt, self.worker_id))
            if held is not None:
                session.rollback()
                self.pass_on(job_id, f"this worker holds node {held} of it already")
                return None
            for rank in range(1, nodes):
                if not rows_changed(session.execute(self._add(session, job_id, attempt, rank))):
                    continue
                if session.execute(job_nodes.hold_starting(job_id, attempt)).first() is None:
                    session.rollback()  # the leader launched, gave up, or the job was cancelled
                    return None
                session.commit()
                logger.info("job %s attempt %d: joined as node %d", job_id, attempt, rank)
                return NodeSeat(job_id, attempt, rank, nodes)
            session.rollback()
        logger.info("job %s attempt %d: every node is taken; a spare copy", job_id, attempt)
        return None

    def _add(self, session: Session, job_id: str, attempt: int, rank: int) -> Any:
        return job_nodes.add_node(
            session.get_bind().dialect.name,
            job_id=job_id,
            attempt=attempt,
            node_rank=rank,
            worker_id=self.worker_id,
            process=self.process,
            host=self.host,
        )

    # -- messages --------------------------------------------------------------------------------
    def publish_copies(self, job_id: str, count: int, countdown: float | None = None) -> None:
        """One message per node still missing: each finds a worker that takes one slot."""
        if count <= 0:
            return
        publish(
            self.settings,
            job_id,
            copies=count,
            countdown=countdown,
            on_failure="could not publish for its missing nodes; retrying",
        )

    def pass_on(self, job_id: str, reason: str) -> None:
        """Hand a copy this worker cannot use back to the queue, delayed by
        ``unfit_republish_seconds``, for another worker; a second copy within half that interval
        is dropped (the leader publishes again for slots still missing)."""
        delay = self.settings.unfit_republish_seconds
        if self.passed_on.sent_within(job_id, delay):
            return
        self.passed_on.note(job_id)
        logger.info("job %s: %s; passing its message on in %g s", job_id, reason, delay)
        self.publish_copies(job_id, 1, countdown=delay)

    # -- assembling the gang ---------------------------------------------------------------------
    def assemble(self, seat: NodeSeat) -> bool:
        """Wait until every node is taken and the leader gave the go (True: launch torchrun
        against ``seat.endpoint``), or until the attempt ends without running (False; the leader
        records why)."""
        if seat.is_leader:
            return self._lead_assembly(seat)
        return self._await_go(seat)

    def _lead_assembly(self, seat: NodeSeat) -> bool:
        deadline = seat.taken_at + self.settings.gang_wait_seconds
        next_publish = time.monotonic() + self.settings.republish_after_seconds
        while True:
            now = utcnow()
            with self.sessions() as session:
                lease = renew_lease(session, seat.job_id, seat.attempt, self.settings)
                if not lease.owned:
                    session.commit()
                    logger.warning("job %s: lost its lease while assembling", seat.job_id)
                    return False
                if lease.cancel_requested:
                    session.execute(job_nodes.leave_all(seat.job_id, seat.attempt))
                    session.execute(
                        job_transitions.finish(
                            seat.job_id,
                            seat.attempt,
                            JobState.CANCELLED,
                            error="cancelled while waiting for the workers of its nodes",
                        )
                    )
                    session.commit()
                    return False
                session.execute(job_nodes.touch(seat.job_id, seat.attempt, 0, self.worker_id))
                session.execute(
                    job_nodes.drop_silent_waiting(
                        seat.job_id, seat.attempt, now - timedelta(seconds=self.lost_after)
                    )
                )
                came = self._waiting(session, seat)
                expired = time.monotonic() >= deadline
                if came >= seat.nodes or expired:
                    decided = self._close_gang(session, seat, expired)
                    if decided is not None:
                        return decided
                session.commit()
            if time.monotonic() >= next_publish:
                self.publish_copies(seat.job_id, seat.nodes - came)
                next_publish = time.monotonic() + self.settings.republish_after_seconds
            time.sleep(POLL_SECONDS)

    def _close_gang(self, session: Session, seat: NodeSeat, expired: bool) -> bool | None:
        """With the job's row locked (a join in flight commits before or after), count again:
        a full gang gets the go (True); past the wait, a partial one is given up (False). None:
        keep waiting. Commits when it decides."""
        if session.execute(job_nodes.hold_starting(seat.job_id, seat.attempt)).first() is None:
            return None  # cancelled or re-queued meanwhile: the next pass sees which
        came = self._waiting(session, seat)
        if came >= seat.nodes:
            seat.endpoint = rendezvous_endpoint(self.host, free_port())
            session.execute(job_nodes.open_rendezvous(seat.job_id, seat.attempt, seat.endpoint))
            session.execute(job_transitions.mark_running(seat.job_id, seat.attempt))
            session.commit()
            logger.info(
                "job %s attempt %d: all %d nodes are here; rendezvous at %s",
                seat.job_id,
                seat.attempt,
                seat.nodes,
                seat.endpoint,
            )
            return True
        if expired:
            self._give_up(session, seat, came)
            return False
        return None

    def _waiting(self, session: Session, seat: NodeSeat) -> int:
        return job_nodes.waiting_count(node_reports(session, seat))

    def _give_up(self, session: Session, seat: NodeSeat, came: int) -> None:
        error = job_nodes.gang_timeout_error(seat.nodes, came, self.settings.gang_wait_seconds)
        session.execute(job_nodes.leave_all(seat.job_id, seat.attempt))
        session.execute(
            job_transitions.finish(seat.job_id, seat.attempt, JobState.FAILED, error=error)
        )
        session.commit()
        logger.warning("job %s attempt %d: %s", seat.job_id, seat.attempt, error)

    def _await_go(self, seat: NodeSeat) -> bool:
        # The leader decides; this bound only frees the slot if the leader vanished unnoticed.
        deadline = seat.taken_at + self.settings.gang_wait_seconds + self.lost_after
        next_touch = 0.0
        while True:
            with self.sessions() as session:
                if time.monotonic() >= next_touch:
                    touched = session.execute(
                        job_nodes.touch(seat.job_id, seat.attempt, seat.node_rank, self.worker_id)
                    ).first()
                    if touched is None:
                        session.commit()
                        logger.warning("job %s: node %d was dropped", seat.job_id, seat.node_rank)
                        return False
                    next_touch = time.monotonic() + self.settings.heartbeat_seconds
                job = seat_job(session, seat)
                endpoint = session.scalar(
                    select(JobNode.endpoint).where(
                        JobNode.job_id == seat.job_id,
                        JobNode.attempt == seat.attempt,
                        JobNode.node_rank == 0,
                    )
                )
                ours = (
                    job is not None
                    and job.attempt == seat.attempt
                    and job.state in (JobState.STARTING, JobState.RUNNING)
                    and not job.cancel_requested
                )
                if ours and job is not None and job.state == JobState.RUNNING and endpoint:
                    seat.endpoint = endpoint
                    session.execute(
                        job_nodes.mark_launched(
                            seat.job_id, seat.attempt, seat.node_rank, self.worker_id
                        )
                    )
                    session.commit()
                    return True
                if not ours or time.monotonic() >= deadline:
                    session.execute(
                        job_nodes.leave(seat.job_id, seat.attempt, seat.node_rank, self.worker_id)
                    )
                    session.commit()
                    logger.info(
                        "job %s attempt %d: node %d leaves (the attempt ended before it ran)",
                        seat.job_id,
                        seat.attempt,
                        seat.node_rank,
                    )
                    return False
                session.commit()
            time.sleep(POLL_SECONDS)
