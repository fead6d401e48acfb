"""How this worker takes part in one attempt: the one interface the supervisor's attempt, the
watch loop and the outcome go through, whatever the job's number of nodes.

A single-node job is a gang of one: :class:`SingleNode` is its whole gang, and it leads. It
renews the job's lease (from a thread of its own while the attempt is prepared, when the watch
loop does not run yet; no ``job_nodes`` row: what is stored and what the API shows is what a
single-node job always had), marks the job ``running`` once torchrun started and records the
outcome from its own exit. A node of a multi-node job is :class:`ace3_worker.gang_node.GangNode`.
The supervisor chooses one of the two once, when it takes the job.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy.orm import Session, sessionmaker

from ace3_control import job_transitions
from ace3_control.models import Job, JobState
from ace3_control.settings import Settings
from ace3_worker import reports
from ace3_worker.attempt import Beat, renew_lease
from ace3_worker.drain import shutdown_timeout
from ace3_worker.launch import LaunchSpec
from ace3_worker.launcher import torchrun_command, warm_torchrun_args
from ace3_worker.outcome import Outcomes
from ace3_worker.watch import AttemptWatch, Watcher

logger = logging.getLogger(__name__)


class Membership(Protocol):
    """This worker's part in one attempt."""

    job_id: str
    attempt: int

    @property
    def node_rank(self) -> int | None:
        """Which node this worker runs (None: the job has one node)."""

    @property
    def nodes(self) -> int:
        """How many nodes (workers) run the attempt."""

    @property
    def name(self) -> str:
        """This worker's part, for the log: ``attempt 3``, ``node 1``."""

    @property
    def hosts_rank_zero(self) -> bool:
        """Whether this node surely hosts global rank 0 before torchrun says so (it then syncs
        the artifacts from the start; otherwise once a rank 0 line comes through)."""

    def keep_alive(self, interrupt: threading.Event | None = None) -> AbstractContextManager[None]:
        """Heartbeat from a thread meanwhile (a slow step outside the watch loop); set
        ``interrupt`` if a heartbeat finds the job cancelled or the attempt no longer its, for
        a step that can stop early (building an environment)."""

    def launch_spec(self, job_file: str, nproc: int) -> LaunchSpec:
        """This node's torchrun command line and sandbox."""

    def started(self) -> None:
        """Torchrun started: the job is ``running``."""

    def beat(self) -> Beat:
        """One heartbeat: renew what this worker holds, read the cancel flag (and the peers)."""

    def report(
        self,
        job: Job,
        watch: AttemptWatch,
        returncode: int,
        events: reports.EventTail,
        beat: Callable[[], None],
    ) -> None:
        """Torchrun exited: record (or report, for the leader to decide) how."""

    def decide(self, watch: AttemptWatch) -> None:
        """After the report: the attempt's leader records it, when that waits for others."""

    def failed_outside_torchrun(self, error: str) -> None:
        """This worker cannot run its part (preparing failed, or the supervisor itself)."""

    def interrupted_outside_torchrun(self) -> None:
        """Preparing stopped because the keep-alive's ``interrupt`` was set: record why."""

    def retry_outside_torchrun(self, reason: str) -> None:
        """Preparing failed for a reason that may pass: retry within the job's budget."""


@dataclass
class SingleNode:
    """A single-node attempt: the gang of one."""

    job_id: str
    attempt: int
    settings: Settings
    sessions: sessionmaker[Session]
    outcomes: Outcomes
    watcher: Watcher

    node_rank: None = None
    nodes: int = 1
    hosts_rank_zero: bool = True

    @property
    def name(self) -> str:
        return f"attempt {self.attempt}"

    @contextlib.contextmanager
    def keep_alive(self, interrupt: threading.Event | None = None) -> Iterator[None]:
        """Renew the job's lease from a thread meanwhile (the watch loop renews it while
        torchrun runs): preparing the directory may build an environment for minutes. A
        heartbeat that finds the job cancelled, or no longer this attempt's, sets ``interrupt``."""
        stop = threading.Event()

        def renew() -> None:
            while not stop.wait(self.settings.heartbeat_seconds):
                try:
                    beat = self.beat()
                except Exception:
                    logger.warning("job %s: lease renewal failed; retrying", self.job_id)
                    continue
                if interrupt is not None and (beat.cancel_requested or not beat.owned):
                    interrupt.set()

        thread = threading.Thread(target=renew, name="ace3-lease-keep-alive", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=self.settings.heartbeat_seconds + 10)

    def launch_spec(self, job_file: str, nproc: int) -> LaunchSpec:
        grace = shutdown_timeout(self.settings)
        return LaunchSpec(
            torchrun_command(job_file, nproc, grace),
            warm_args=warm_torchrun_args(job_file, nproc, grace),
        )

    def started(self) -> None:
        with self.sessions() as session:
            session.execute(job_transitions.mark_running(self.job_id, self.attempt))
            session.commit()

    def beat(self) -> Beat:
        with self.sessions() as session:
            beat = renew_lease(session, self.job_id, self.attempt, self.settings)
            session.commit()
        return beat

    def report(
        self,
        job: Job,
        watch: AttemptWatch,
        returncode: int,
        events: reports.EventTail,
        beat: Callable[[], None],
    ) -> None:
        self.watcher.through_outage(
            watch, beat, lambda: self.outcomes.record_attempt(job, watch, returncode, events)
        )

    def decide(self, watch: AttemptWatch) -> None:
        return None  # (recorded by the report)

    def failed_outside_torchrun(self, error: str) -> None:
        self.outcomes.record_surviving_outage(
            self.job_id, self.attempt, JobState.FAILED, error=error
        )

    def interrupted_outside_torchrun(self) -> None:
        """Cancelled while it prepared (a lost lease: the job is no longer ours; nothing)."""
        self.outcomes.record_surviving_outage(self.job_id, self.attempt, JobState.CANCELLED)

    def retry_outside_torchrun(self, reason: str) -> None:
        """The next attempt, while the retry budget lasts; past it the job fails saying why."""
        if not self.outcomes.retry(self.job_id, self.attempt, reason):
            self.failed_outside_torchrun(reason)
