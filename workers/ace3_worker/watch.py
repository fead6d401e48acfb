"""Watching a running attempt: the loop that heartbeats, enforces ``max_runtime_seconds``,
escalates SIGTERM to SIGKILL, stores a batch of output and syncs the artifacts, in a pass
whenever the job writes a line (at most every ``MIN_PASS_SECONDS``), at least every
``POLL_SECONDS``, and at once when torchrun exits; and riding out a database outage meanwhile
and afterwards.

What a heartbeat does (renew the job's lease, or a node's row) is the attempt's membership's
(:mod:`ace3_worker.membership`); what it learned is applied here, the same way for a single-node
job and for each node of a multi-node one: a lost lease, a cancel request or a peer node's
trouble sends SIGTERM to torchrun, and SIGKILL follows after ``cancel_grace_seconds``. A worker
that is draining (:mod:`ace3_worker.drain`) preempts its single-node attempts the same way, with
the preemption grace instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy.exc import DBAPIError

from ace3_control.models import Job
from ace3_control.settings import Settings
from ace3_worker import reports
from ace3_worker.artifact_sync import ArtifactSync
from ace3_worker.attempt import (
    MAX_DB_RETRY_SECONDS,
    MIN_PASS_SECONDS,
    POLL_SECONDS,
    Beat,
)
from ace3_worker.drain import draining, grace_seconds
from ace3_worker.export_registration import StoreOutage
from ace3_worker.ingest import Ingest, JobOutput
from ace3_worker.job_dir import JobDirectory
from ace3_worker.launch import RunningTorchrun
from ace3_worker.sandbox.launch import SandboxedProcess

logger = logging.getLogger(__name__)


@dataclass
class RunState:
    """The run as the watch loop keeps it: the lease, why the service stops the processes, and
    the timers of stopping them. Written by this module only (a heartbeat's news goes through
    :func:`apply_beat`); the outcome and the membership read it."""

    cancel_requested: bool = False
    lease_lost: bool = False
    # Multi-node: why another node made this one stop (its failure, its silence).
    peer_trouble: str | None = None
    # Why the service stopped the attempt on its own (max_runtime_seconds, a per-job limit).
    stopped_for: str | None = None
    # The stop was for the job's memory limit: the out-of-memory back-off applies.
    out_of_memory: bool = False
    # Why this worker preempted the attempt (it is draining: ace3_worker.drain), and the grace
    # its ranks have to checkpoint before SIGKILL. Only single-node attempts are preempted.
    preemptible: bool = True
    preempted_for: str | None = None
    preemption_grace: float | None = None
    started_at: float = field(default_factory=time.monotonic)
    terminate_sent_at: float | None = None
    killed: bool = False
    lease_renewed_at: float = field(default_factory=time.monotonic)

    @property
    def stopping(self) -> bool:
        """Whether the service wants the attempt's processes gone (lease lost, cancel, a peer
        node's trouble)."""
        return self.lease_lost or self.cancel_requested or self.peer_trouble is not None


@dataclass(frozen=True)
class AttemptWatch:
    """What the supervisor tracks while the ranks run, in two parts each written by one module:
    ``output`` by the ingest (:class:`ace3_worker.ingest.JobOutput`), ``run`` by the watch loop
    (:class:`RunState`). The outcome decides from both and writes neither."""

    job_id: str
    attempt: int
    output: JobOutput = field(default_factory=JobOutput)
    run: RunState = field(default_factory=RunState)


def stop_processes(watch: AttemptWatch, process: SandboxedProcess) -> None:
    """SIGTERM to torchrun, once (SIGKILL follows after the grace period: :meth:`escalate`)."""
    if watch.run.terminate_sent_at is None:
        process.terminate()
        watch.run.terminate_sent_at = time.monotonic()


def stop_for(watch: AttemptWatch, process: SandboxedProcess, reason: str) -> None:
    """Stop the attempt for a reason of the service's own, found outside the watch loop (a
    dataset shard that changed since it was registered: :mod:`ace3_worker.shard_feed`): the
    job fails with ``reason``, without a retry, as past ``max_runtime_seconds``. Safe from
    another thread (the loop only escalates the SIGTERM sent here)."""
    if watch.run.stopped_for is None:
        watch.run.stopped_for = reason
    stop_processes(watch, process)


def kill_for(
    watch: AttemptWatch, process: SandboxedProcess, reason: str, *, out_of_memory: bool = False
) -> None:
    """Kill the attempt at once for a limit the job passed (its disk or memory:
    :mod:`ace3_worker.usage_monitor`): no grace, in which it would only write or allocate more.
    The job fails with ``reason`` without a retry, or, for memory (``out_of_memory``), gets the
    out-of-memory back-off where it applies (:mod:`ace3_worker.outcome`). Safe from another
    thread, like :func:`stop_for`."""
    if watch.run.stopped_for is None:
        watch.run.out_of_memory = out_of_memory
        watch.run.stopped_for = reason
    if watch.run.terminate_sent_at is None:
        watch.run.terminate_sent_at = time.monotonic()
    process.kill()
    watch.run.killed = True


def apply_beat(watch: AttemptWatch, beat: Beat, process: SandboxedProcess, who: str) -> None:
    """What a heartbeat learned: the lease renewed or lost, a cancel request, a peer node's
    trouble; any of the last three stops ``who`` (the attempt's processes, or a node)."""
    if beat.owned:
        watch.run.lease_renewed_at = time.monotonic()
    else:
        if not watch.run.lease_lost:
            logger.error(
                "job %s attempt %d is no longer this attempt's (its lease is lost): stopping %s",
                watch.job_id,
                watch.attempt,
                who,
            )
        watch.run.lease_lost = True
    if beat.owned and beat.cancel_requested:
        watch.run.cancel_requested = True
    if beat.owned and beat.trouble and watch.run.peer_trouble is None:
        logger.warning(
            "job %s attempt %d: stopping %s: %s", watch.job_id, watch.attempt, who, beat.trouble
        )
        watch.run.peer_trouble = beat.trouble
    if watch.run.stopping:
        stop_processes(watch, process)


class Watcher:
    """Runs the watch loop of this worker's attempts."""

    def __init__(self, settings: Settings, ingest: Ingest) -> None:
        self.settings = settings
        self.ingest = ingest

    def watch(
        self,
        job: Job,
        directory: JobDirectory,
        watch: AttemptWatch,
        running: RunningTorchrun,
        events: reports.EventTail,
        artifacts: ArtifactSync,
        beat: Callable[[], None],
    ) -> int:
        """Watch torchrun until it exits, then kill what is left of its sandbox; its exit
        status."""
        process, lines = running.process, running.lines
        max_runtime = job.config.get("max_runtime_seconds")

        def ingest() -> None:
            self.ingest.store_batch(job, directory, watch, lines, events, running.limiter)

        next_heartbeat = next_artifact_sync = 0.0
        passed = time.monotonic()
        try:
            while True:
                exited = process.poll() is not None
                if time.monotonic() >= next_heartbeat:
                    self.tolerating_database_errors(watch, process, beat)
                    next_heartbeat = time.monotonic() + self.settings.heartbeat_seconds
                if max_runtime and not exited:
                    self.enforce_max_runtime(watch, process, float(max_runtime))
                if not exited and draining():
                    self.preempt(watch, process, job)
                self.escalate(watch, process)
                self.tolerating_database_errors(watch, process, ingest)
                if (
                    time.monotonic() >= next_artifact_sync
                    and not exited
                    and watch.output.syncs_artifacts
                ):
                    self.tolerating_database_errors(
                        watch, process, lambda: self.ingest.sync_artifacts(artifacts, lines)
                    )
                    next_artifact_sync = time.monotonic() + self.settings.artifact_sync_seconds
                if exited:
                    break
                self.wait_for_activity(running, passed)
                passed = time.monotonic()
        finally:
            # Whatever happened, nothing of this attempt may outlive it.
            returncode = running.stop()
        return returncode

    @staticmethod
    def wait_for_activity(running: RunningTorchrun, passed: float) -> None:
        """Until the job writes a line or torchrun exits (at once: its outcome is not kept
        waiting), at most POLL_SECONDS; a job that writes without pause gets a pass at most
        every MIN_PASS_SECONDS after the one that began at ``passed``."""
        if running.activity.wait(timeout=POLL_SECONDS):
            running.activity.clear()
            rest = passed + MIN_PASS_SECONDS - time.monotonic()
            if rest > 0 and running.process.poll() is None:
                time.sleep(rest)

    def enforce_max_runtime(
        self, watch: AttemptWatch, process: SandboxedProcess, max_runtime: float
    ) -> None:
        elapsed = time.monotonic() - watch.run.started_at
        if elapsed <= max_runtime or watch.run.terminate_sent_at is not None:
            return
        watch.run.stopped_for = (
            f"the attempt ran past max_runtime_seconds={max_runtime:g} (stopped after "
            f"{elapsed:.0f} s)"
        )
        logger.warning("job %s attempt %d: %s", watch.job_id, watch.attempt, watch.run.stopped_for)
        stop_processes(watch, process)

    def preempt(self, watch: AttemptWatch, process: SandboxedProcess, job: Job) -> None:
        """The worker is draining: SIGTERM to torchrun, whose ranks checkpoint and leave; the
        outcome re-queues the job (:meth:`ace3_worker.outcome.Outcomes.record_attempt`)."""
        if not watch.run.preemptible or watch.run.preempted_for is not None:
            return
        if watch.run.terminate_sent_at is not None:
            return  # (already being stopped: cancel, max runtime, lease lost)
        watch.run.preempted_for = "the worker is draining"
        watch.run.preemption_grace = grace_seconds(job.config, self.settings)
        logger.warning(
            "job %s attempt %d: preempting (%s); its ranks have %.0f s to checkpoint",
            watch.job_id,
            watch.attempt,
            watch.run.preempted_for,
            watch.run.preemption_grace,
        )
        stop_processes(watch, process)

    def escalate(self, watch: AttemptWatch, process: SandboxedProcess) -> None:
        if watch.run.terminate_sent_at is None or watch.run.killed or process.poll() is not None:
            return
        grace = self.settings.cancel_grace_seconds
        if watch.run.preemption_grace is not None and not watch.run.stopping:
            grace = watch.run.preemption_grace  # (a cancel meanwhile keeps the cancel's grace)
        if time.monotonic() - watch.run.terminate_sent_at >= grace:
            process.kill()
            watch.run.killed = True

    # -- database outages ------------------------------------------------------------------------
    def tolerating_database_errors(
        self, watch: AttemptWatch, process: SandboxedProcess, action: Callable[[], object]
    ) -> None:
        """Ride out a database outage: training goes on and the action is retried next pass.
        Once the lease cannot have been renewed in time, another worker may own the job: stop."""
        try:
            action()
        except DBAPIError as exc:
            logger.warning(
                "job %s: database unreachable (%s); retrying", watch.job_id, type(exc).__name__
            )
            if (
                watch.run.lease_lost
                or time.monotonic() - watch.run.lease_renewed_at <= self.settings.lease_seconds
            ):
                return
            logger.error(
                "job %s: lease not renewed for %.0f s: stopping",
                watch.job_id,
                self.settings.lease_seconds,
            )
            watch.run.lease_lost = True
            stop_processes(watch, process)

    def through_outage(
        self, watch: AttemptWatch, beat: Callable[[], None], action: Callable[[], object]
    ) -> None:
        """Run a last step of the attempt (store what is left, record the outcome) through a
        database or artifact-store outage, as the watch loop does: retried with the heartbeat
        until it works, or until the lease cannot be this attempt's any more (a store failing
        for a lease's length, while the heartbeats still renew it, counts as that too): the
        reconciler then re-queues the job, which resumes from its last stored checkpoint."""
        delay = POLL_SECONDS
        store_failing_since: float | None = None
        while True:
            try:
                if time.monotonic() - watch.run.lease_renewed_at > self.settings.heartbeat_seconds:
                    beat()
                action()
                return
            except (DBAPIError, StoreOutage) as exc:
                now = time.monotonic()
                waited = now - watch.run.lease_renewed_at
                if isinstance(exc, StoreOutage):
                    store_failing_since = store_failing_since or now
                    waited = max(waited, now - store_failing_since)
                if watch.run.lease_lost or waited > self.settings.lease_seconds:
                    logger.error(
                        "job %s attempt %d: %s for %.0f s after the run; giving the job up to "
                        "the reconciler",
                        watch.job_id,
                        watch.attempt,
                        exc if isinstance(exc, StoreOutage) else "database unreachable",
                        waited,
                    )
                    watch.run.lease_lost = True
                    return
                logger.warning(
                    "job %s: %s unreachable (%s); retrying",
                    watch.job_id,
                    "artifact store" if isinstance(exc, StoreOutage) else "database",
                    type(exc).__name__,
                )
                time.sleep(delay)
                delay = min(delay * 2, MAX_DB_RETRY_SECONDS)
