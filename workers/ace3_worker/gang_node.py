"""A node of a multi-node job once its gang is assembled (:mod:`ace3_worker.gang`): the
:class:`~ace3_worker.membership.Membership` of a multi-node attempt.

Each node launches ``torchrun --rdzv-backend c10d`` against the leader's endpoint, heartbeats
its ``job_nodes`` row (the leader also renews the job's lease) and watches the other nodes: one
that failed or went silent stops this one too. After its torchrun exited a node reports how
(``ace3_control.job_nodes.report_exit``); the leader (node 0) waits for every report, or a
node's silence, and records the attempt from the verdict (``job_nodes.attempt_verdict``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ace3_control import job_nodes
from ace3_control.models import ACTIVE_STATES, Job, JobState, NodeState, utcnow
from ace3_worker import reports
from ace3_worker.attempt import Beat, renew_lease
from ace3_worker.drain import shutdown_timeout
from ace3_worker.gang import POLL_SECONDS, GangMember, NodeSeat, node_reports, seat_job
from ace3_worker.launch import LaunchSpec
from ace3_worker.launcher import multinode_torchrun_command
from ace3_worker.outcome import Outcomes, final_metrics
from ace3_worker.watch import AttemptWatch

logger = logging.getLogger(__name__)


class GangNode:
    """This worker's node (``seat``) of one multi-node attempt."""

    def __init__(self, member: GangMember, seat: NodeSeat, outcomes: Outcomes) -> None:
        self.member = member
        self.seat = seat
        self.outcomes = outcomes
        self.settings = member.settings
        self.sessions = member.sessions
        self.job_id = seat.job_id
        self.attempt = seat.attempt

    @property
    def node_rank(self) -> int:
        return self.seat.node_rank

    @property
    def nodes(self) -> int:
        return self.seat.nodes

    @property
    def name(self) -> str:
        return f"node {self.seat.node_rank}"

    @property
    def hosts_rank_zero(self) -> bool:
        return False  # (c10d assigns the ranks: the node whose torchrun prints rank 0's lines)

    def launch_spec(self, job_file: str, nproc: int) -> LaunchSpec:
        seat = self.seat
        assert seat.endpoint is not None
        command = multinode_torchrun_command(
            job_file,
            nproc,
            nnodes=seat.nodes,
            endpoint=seat.endpoint,
            rendezvous_id=seat.rendezvous_id,
            is_host=seat.is_leader,
            local_addr=self.member.host,
            join_timeout=self.settings.gang_wait_seconds,
            shutdown_timeout=shutdown_timeout(self.settings),
        )
        # ACE3_NODE_ID: unique among this machine's running nodes (see ace3.runtime.process.torchrun).
        return LaunchSpec(command, share_network=True, env={"ACE3_NODE_ID": str(os.getpid())})

    def started(self) -> None:
        return None  # (the leader marked the job running at the go)

    # -- heartbeats ------------------------------------------------------------------------------
    def beat(self) -> Beat:
        """Heartbeat this node (the leader also renews the job's lease) and read the cancel
        flag and the other nodes."""
        seat = self.seat
        now = utcnow()
        with self.sessions() as session:
            if seat.is_leader:
                lease = renew_lease(session, seat.job_id, seat.attempt, self.settings)
                owned, cancel = lease.owned, lease.cancel_requested
            else:
                job = seat_job(session, seat)
                owned = (
                    job is not None and job.attempt == seat.attempt and job.state in ACTIVE_STATES
                )
                cancel = bool(job is not None and job.cancel_requested)
            session.execute(self._touch())
            nodes = node_reports(session, seat)
            session.commit()
        trouble = job_nodes.peer_trouble(
            nodes, seat.node_rank, seat.nodes, now, self.member.lost_after
        )
        return Beat(owned, cancel, trouble)

    def _touch(self) -> Any:
        seat = self.seat
        return job_nodes.touch(seat.job_id, seat.attempt, seat.node_rank, self.member.worker_id)

    @contextlib.contextmanager
    def keep_alive(self, interrupt: threading.Event | None = None) -> Iterator[None]:
        """Heartbeat this node from a thread meanwhile (while its directory is prepared, and
        after torchrun exited, while the last artifacts and checkpoints are stored and the exit
        reported, which may take longer than the other nodes' patience). ``interrupt`` is never
        set: a gang learns of a cancel once its nodes run (the leader's watch loop stops them)."""
        seat = self.seat
        stop = threading.Event()

        def touch() -> None:
            while not stop.wait(self.settings.heartbeat_seconds):
                try:
                    with self.sessions() as session:
                        session.execute(self._touch())
                        if seat.is_leader:
                            renew_lease(session, seat.job_id, seat.attempt, self.settings)
                        session.commit()
                except Exception:
                    logger.warning("job %s: node heartbeat failed; retrying", seat.job_id)

        thread = threading.Thread(target=touch, name="ace3-node-keep-alive", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=self.settings.heartbeat_seconds + 10)

    # -- the outcome -----------------------------------------------------------------------------
    def report(
        self,
        job: Job,
        watch: AttemptWatch,
        returncode: int,
        events: reports.EventTail,
        beat: Callable[[], None],
    ) -> None:
        """Report how this node's torchrun ended (the leader reads it). A torchrun that failed
        before any heartbeat saw a reason reads the cancel flag once more: when a cancel stops
        one node, the ranks of the others may die of the broken connection first, and they were
        stopped by that cancel, not failed on their own. (Only the cancel flag: a peer that
        failed meanwhile may have failed *because* of this node, whose error is then the cause.)"""
        cancelled = False
        if returncode != 0 and not watch.run.stopping:
            try:
                last = self.beat()
            except Exception:
                logger.warning("job %s: reading the cancel flag at exit failed", self.seat.job_id)
            else:
                cancelled = last.owned and last.cancel_requested
        node = self.outcomes.node_exit(watch, returncode, cancelled_at_exit=cancelled)
        self._report_exit(
            exit_code=node.exit_code,
            error=node.error,
            stopped=node.stopped,
            final_metrics=final_metrics(events),
        )

    def _report_exit(
        self,
        *,
        exit_code: int,
        error: str | None,
        stopped: str | None,
        final_metrics: dict[str, Any] | None,
    ) -> None:
        seat = self.seat
        with self.sessions() as session:
            session.execute(
                job_nodes.report_exit(
                    seat.job_id,
                    seat.attempt,
                    seat.node_rank,
                    self.member.worker_id,
                    exit_code=exit_code,
                    error=error,
                    stopped=stopped,
                    final_metrics=final_metrics,
                )
            )
            session.commit()

    def decide(self, watch: AttemptWatch) -> None:
        """The leader waits for every node's report (or its silence) and records the attempt."""
        seat = self.seat
        if not seat.is_leader or watch.run.lease_lost:
            return
        verdict = self.collect()
        if verdict is None:
            logger.warning(
                "job %s attempt %d: lease lost while collecting", seat.job_id, seat.attempt
            )
            return
        self.outcomes.apply_verdict(seat.job_id, seat.attempt, verdict)

    def retry_outside_torchrun(self, reason: str) -> None:
        """A node that cannot run reports it; the leader's verdict retries the gang or not."""
        self.failed_outside_torchrun(reason)

    def interrupted_outside_torchrun(self) -> None:
        """(Never called: this node's keep-alive never sets its interrupt.)"""
        self.failed_outside_torchrun("preparing the node was interrupted")

    def failed_outside_torchrun(self, error: str) -> None:
        """This node cannot run: report it (the other nodes stop), and as the leader decide."""
        seat = self.seat
        try:
            self._report_exit(
                exit_code=1,
                error=f"node {seat.node_rank}: {error}",
                stopped=None,
                final_metrics=None,
            )
            if seat.is_leader:
                verdict = self.collect()
                if verdict is not None:
                    self.outcomes.apply_verdict(seat.job_id, seat.attempt, verdict)
        except Exception:
            logger.exception("job %s: could not report node %d", seat.job_id, seat.node_rank)
            if seat.is_leader:
                self.outcomes.record(seat.job_id, seat.attempt, JobState.FAILED, error=error)

    def collect(self) -> job_nodes.Verdict | None:
        """The leader, after its own report: wait until every node reported or went silent
        (renewing the lease), then decide the attempt. None: the lease was lost (a newer attempt
        owns the job; nothing to record)."""
        seat, lost_after = self.seat, self.member.lost_after
        deadline = time.monotonic() + lost_after + self.settings.cancel_grace_seconds
        next_renew = 0.0
        cancel = False
        while True:
            now = utcnow()
            with self.sessions() as session:
                if time.monotonic() >= next_renew:
                    lease = renew_lease(session, seat.job_id, seat.attempt, self.settings)
                    if not lease.owned:
                        session.commit()
                        return None
                    cancel = lease.cancel_requested
                    next_renew = time.monotonic() + self.settings.heartbeat_seconds
                nodes = node_reports(session, seat)
                session.commit()
            pending = [
                node
                for node in nodes
                if node.state != NodeState.EXITED and not node.silent(now, lost_after)
            ]
            if not pending or time.monotonic() >= deadline:
                return job_nodes.attempt_verdict(
                    nodes, needed=seat.nodes, attempt=seat.attempt, cancel_requested=cancel
                )
            time.sleep(POLL_SECONDS)
