"""Runs one attempt of a job: claim, prepare, launch torchrun, watch it, record the outcome.

This is the one place a job's state is written from on the worker side. Every write is a
conditional update fenced by the attempt number (``ace3_control.job_transitions``), so a duplicate
message or a worker that lost its lease changes nothing. The torchrun process runs in its own
process group; cancelling sends SIGTERM to the group, then SIGKILL after a grace period, and the
group is always killed before the attempt is recorded, so no process outlives its job.

Before claiming, the supervisor checks the job fits this worker (``ace3_control.capacity``: enough
GPUs or CPU processes, a CUDA worker for nccl). One that does not is handed back to the queue,
delayed, for a worker that can run it: a job never runs with fewer processes than it asked for.

A multi-node job (``num_nodes > 1``) runs one node per worker (``ace3_worker.gang``): this
supervisor takes a node slot, waits for the whole gang, launches its node's torchrun against the
leader's c10d rendezvous, and watches the other nodes as well as its own processes. Every node
stores its ranks' log lines; the node that hosts global rank 0 (c10d assigns the ranks) also
stores the metrics and checkpoints and syncs the artifacts; the leader (node 0) records the
job's outcome from every node's report.

Every attempt runs in the worker's sandbox (:mod:`ace3_worker.sandbox`): its own uid (leased
before the claim, released after everything of the attempt is dead), namespaces, rlimits; its
directory holds copies of its inputs and is removed on every path. Everything the job writes is
untrusted: log lines are rate-limited and capped (:mod:`ace3_worker.log_limits`), events are
validated (:mod:`ace3.events`) and a refused one becomes a warning in the job's log
(stream ``service``, which a job cannot write), checkpoints are read only from the attempt's
checkpoint directory and never deleted there. Each pass of the watch loop stores a bounded batch,
so a job that prints without end cannot starve the heartbeat.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import queue
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from sqlalchemy import select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from ace3.config import TrainingConfig, parallel_degrees, runs_pipeline
from ace3.errors import OUT_OF_MEMORY_EXIT_CODE
from ace3.events import (
    CheckpointRecord,
    EventRecord,
    MetricsRecord,
    NonFiniteLossRecord,
    RefusedRecord,
    RunPlan,
    StartRecord,
)
from ace3_control import job_nodes, job_transitions
from ace3_control.capacity import JobNeeds, fit_problem
from ace3_control.db import make_sync_engine, sync_session_factory
from ace3_control.models import Job, JobCheckpoint, JobState, StoredDataset, StoredModel
from ace3_control.settings import Settings, get_settings
from ace3_control.storage import LocalArtifactStore
from ace3_worker import reports
from ace3_worker.artifact_sync import ArtifactSync
from ace3_worker.device import local_capacity, worker_device
from ace3_worker.failures import RankFailure, failed_ranks, failure_message, root_cause
from ace3_worker.gang import GangMember, NodeSeat
from ace3_worker.job_dir import (
    JobDirectory,
    JobOwner,
    attempt_path,
    hand_over,
    prepare_job_directory,
    remove_attempt_directory,
)
from ace3_worker.launcher import multinode_torchrun_command, rank_environment, torchrun_command
from ace3_worker.log_limits import LogLimiter
from ace3_worker.messages import RecentCopies, publish
from ace3_worker.sandbox.identity import JobIdentity, NoFreeIdentityError, lease_identity
from ace3_worker.sandbox.launch import SandboxedProcess, launch, sandbox_environment
from ace3_worker.sandbox.limits import JobLimits
from ace3_worker.sandbox.plan import SandboxPlan, sandbox_plan

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.25
ERROR_TAIL_LINES = 40
# What one pass of the watch loop stores at most (the rest waits for the next pass).
LINES_PER_PASS = 2000
RECORDS_PER_PASS = 500
# Lines read but not yet stored (the database may be down): past it, lines are dropped.
MAX_QUEUED_LINES = 50_000
MAX_NOTICES_PER_ATTEMPT = 200  # refused records past this are counted, not each logged
SERVICE_STREAM = "service"  # the worker's own notices in a job's log (a job cannot write it)


@functools.cache
def _sessions(database_url: str) -> sessionmaker[Session]:
    # One engine per worker process (created after Celery's fork, on first use).
    return sync_session_factory(make_sync_engine(database_url))


def worker_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def max_micro_batch_halvings(config: dict[str, Any], num_processes: int) -> int:
    """How often a job's micro-batch can be halved after running out of memory: until it is
    one sample (log2 of the per-rank micro-batch); none for a job that cannot run out of memory
    that way (``dynamic_batch_size`` off, or a pipeline, whose step has no such recovery),
    whatever exit status its ranks claim."""
    try:
        settings = TrainingConfig.model_validate(config)
    except ValueError:
        return 0
    if not settings.dynamic_batch_size or runs_pipeline(settings):
        return 0
    # The global batch splits evenly over the data-parallel replicas (all the processes, unless
    # tensor parallelism groups them).
    processes = max(1, num_processes)
    stages, ways = parallel_degrees(settings, processes)
    per_rank = max(1, settings.batch_size // max(1, processes // (stages * ways)))
    return max(0, per_rank.bit_length() - 1)


@dataclass
class PendingRecord:
    """An events record read but not yet stored, with what reading it decided."""

    record: EventRecord | RefusedRecord
    checkpoint: reports.StagedCheckpoint | None = None  # a valid checkpoint, copied to the store
    notice: str | None = None  # the warning for the job's log
    plan: RunPlan | None = None  # an accepted start record's plan, for the job row


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
    lease_renewed_at: float = field(default_factory=time.monotonic)


def _pump(
    stream: IO[bytes], name: str, lines: queue.Queue[reports.LogLine], limiter: LogLimiter
) -> None:
    """Read one of torchrun's streams line by line (a line is cut at MAX_LINE_CHARS bytes and
    its rest skipped), queueing what the limiter admits."""
    limit = reports.MAX_LINE_CHARS
    skipping = False  # the rest of a line already cut
    for raw in iter(lambda: stream.readline(limit), b""):
        complete = raw.endswith(b"\n")
        if skipping:
            skipping = not complete
            continue
        skipping = not complete and len(raw) >= limit
        if lines.qsize() >= MAX_QUEUED_LINES:
            limiter.drop("the database is not keeping up with the job's log")
        elif limiter.admit(len(raw)):
            lines.put(reports.parse_log_line(name, raw.decode("utf-8", errors="replace")))
    stream.close()


def _service_line(text: str) -> reports.LogLine:
    """A line of the worker's own (which may quote what a job wrote)."""
    return reports.LogLine(
        SERVICE_STREAM, None, reports.storable_text(text[: reports.MAX_LINE_CHARS])
    )


class Supervisor:
    """Runs jobs' attempts for one worker process. It may live as long as the process (the
    Celery task keeps one per process): what it remembers between jobs is which copies of a
    job's message it handed back or passed on."""

    def __init__(self, settings: Settings, node_id: str | None = None) -> None:
        """``node_id`` names this worker in multi-node gangs (one node per worker per attempt):
        the worker's registry id, shared by its slots (by default, this process's identity)."""
        self.settings = settings
        self.sessions = _sessions(settings.resolved_database_url)
        self.store = LocalArtifactStore(settings.resolved_storage_dir)
        self.worker_id = worker_identity()
        self.limits = JobLimits.from_settings(settings)
        self.handed_back = RecentCopies()
        self.gang = GangMember(
            settings, self.sessions, worker_id=node_id or self.worker_id, process=self.worker_id
        )

    @property
    def plan(self) -> SandboxPlan:
        """This worker's sandbox (decided and checked once per process)."""
        return sandbox_plan(self.settings)

    # -- claim and prepare -----------------------------------------------------------------------
    def claim(self, job_id: str) -> int | None:
        with self.sessions() as session:
            row = session.execute(
                job_transitions.claim(job_id, self.worker_id, self.settings.lease_seconds)
            ).first()
            session.commit()
        return None if row is None else int(row.attempt)

    def lease_identity(self) -> JobIdentity | None:
        """The uid the next attempt runs as (None: the worker's own; no dedicated uids)."""
        if not self.plan.dedicated_uids:
            return None
        settings = self.settings
        return lease_identity(
            settings.sandbox_lock_dir, settings.sandbox_uid_base, settings.sandbox_uid_count
        )

    def prepare(
        self,
        job_id: str,
        attempt: int,
        identity: JobIdentity | None = None,
        node_rank: int | None = None,
    ) -> tuple[Job, JobDirectory]:
        with self.sessions() as session:
            job = session.get(Job, job_id)
            assert job is not None
            model = session.get(StoredModel, job.model_id)
            dataset = session.get(StoredDataset, job.dataset_id)
            validation = (
                session.get(StoredDataset, job.validation_dataset_id)
                if job.validation_dataset_id
                else None
            )
            if model is None or dataset is None:
                raise FileNotFoundError("the job's model or dataset record is gone")
            resume_from = resume_checkpoint(session, job, attempt)
            directory = prepare_job_directory(
                self.settings.resolved_work_dir,
                self.store,
                job,
                attempt,
                model,
                dataset,
                validation,
                resume_from,
                node_rank,
                visible_root=self.plan.visible_root,
                owner=_owner(identity),
            )
            if resume_from is not None:
                logger.info("job %s attempt %d resumes from %s", job_id, attempt, resume_from.name)
            return job, directory

    # -- the run ---------------------------------------------------------------------------------
    def artifact_sync(
        self,
        job: Job,
        attempt: int,
        directory: JobDirectory,
        identity: JobIdentity | None = None,
    ) -> ArtifactSync:
        """The attempt's artifact sync, with the job's recorded artifacts restored into its
        (fresh) artifacts directory, so a re-queued attempt continues them."""
        sync = ArtifactSync(
            job.id, attempt, directory.artifacts_dir, self.store, self.settings.max_artifact_bytes
        )
        with self.sessions() as session:
            sync.load(session)
        if sync.recorded:
            restored = sync.restore()
            hand_over(directory.artifacts_dir, _owner(identity))
            logger.info("job %s attempt %d: restored %d artifact(s)", job.id, attempt, restored)
        return sync

    def unfit_reason(self, job_id: str) -> str | None:
        """Why this worker cannot run the queued job, or a node of the multi-node job that
        assembles its gang (None: it can, or there is nothing to take, which the claim then
        finds out)."""
        return self._unfit(self._shape(job_id))

    def _unfit(self, shape: tuple[str, JobNeeds] | None) -> str | None:
        if shape is None:
            return None
        state, needs = shape
        if state != JobState.QUEUED and not (state == JobState.STARTING and needs.nodes > 1):
            return None
        return fit_problem(needs, local_capacity(self.settings))

    def _shape(self, job_id: str) -> tuple[str, JobNeeds] | None:
        """The job's state and what each of its nodes needs."""
        with self.sessions() as session:
            row = session.execute(
                select(Job.state, Job.num_processes, Job.config).where(Job.id == job_id)
            ).first()
        if row is None:
            return None
        return str(row.state), JobNeeds.from_job(int(row.num_processes), row.config)

    def hand_back(self, job_id: str, reason: str) -> None:
        """Publish a job this worker cannot run again, delayed by ``unfit_republish_seconds``,
        for a worker that can. A copy of the same job that comes back to this process within
        half that interval is dropped (another copy is on its way), so copies never multiply and
        a worker never spins on a job; the reconciler re-publishes it if every copy is lost."""
        delay = self.settings.unfit_republish_seconds
        if self.handed_back.sent_within(job_id, delay):
            logger.debug("job %s: another copy was handed back just now; dropping this one", job_id)
            return
        with self.sessions() as session:
            result = session.execute(job_transitions.mark_handed_back(job_id))
            session.commit()
        if not result.rowcount:
            return  # claimed or cancelled meanwhile
        self.handed_back.note(job_id)
        logger.info(
            "job %s does not fit this worker (%s): handing it back to the queue in %g s",
            job_id,
            reason,
            delay,
        )
        publish(
            self.settings,
            job_id,
            countdown=delay,
            on_failure="not handed back; the reconciler will publish it",
        )

    def run(self, job_id: str) -> None:
        shape = self._shape(job_id)
        reason = self._unfit(shape)
        if reason is not None:
            # Never run a job with fewer processes than it asked for, nor nccl without a GPU.
            if shape is not None and shape[0] == JobState.STARTING:
                self.gang.pass_on(job_id, f"a node of it does not fit this worker ({reason})")
            else:
                self.hand_back(job_id, reason)
            return
        if shape is not None and shape[1].nodes > 1:
            self.run_node(job_id)
            return
        try:
            identity = self.lease_identity()
        except NoFreeIdentityError as exc:
            self.hand_back(job_id, str(exc))
            return
        try:
            attempt = self.claim(job_id)
            if attempt is None:
                logger.info(
                    "job %s is not queued (a duplicate message, or cancelled): nothing to do",
                    job_id,
                )
                return
            self._run_attempt(job_id, attempt, identity)
        finally:
            if identity is not None:
                identity.release()

    def _run_attempt(self, job_id: str, attempt: int, identity: JobIdentity | None) -> None:
        """Prepare, run and record one claimed attempt; its directory goes on every path."""
        try:
            try:
                job, directory = self.prepare(job_id, attempt, identity)
                device = worker_device(self.settings.worker_device)
            except Exception as exc:
                logger.exception("job %s: could not prepare attempt %d", job_id, attempt)
                self._record_surviving_outage(
                    job_id, attempt, JobState.FAILED, error=f"could not prepare the job: {exc}"
                )
                return
            try:
                self._launch_and_watch(job, attempt, directory, device, identity)
            except Exception as exc:
                logger.exception("job %s: the supervisor failed during attempt %d", job_id, attempt)
                self._record_surviving_outage(
                    job_id,
                    attempt,
                    JobState.FAILED,
                    error=f"the worker could not run the job: {exc}",
                )
        finally:
            remove_attempt_directory(attempt_path(self.settings.resolved_work_dir, job_id, attempt))

    def run_node(self, job_id: str) -> None:
        """One node of a multi-node job: take a slot, wait for the gang, run, report."""
        try:
            identity = self.lease_identity()
        except NoFreeIdentityError as exc:
            self.gang.pass_on(job_id, str(exc))
            return
        try:
            seat = self.gang.take(job_id)
            if seat is None or not self.gang.assemble(seat):
                return
            self._run_node_attempt(seat, identity)
        finally:
            if identity is not None:
                identity.release()

    def _run_node_attempt(self, seat: NodeSeat, identity: JobIdentity | None) -> None:
        job_id = seat.job_id
        root = attempt_path(self.settings.resolved_work_dir, job_id, seat.attempt, seat.node_rank)
        try:
            try:
                with self.gang.keep_alive(seat):
                    job, directory = self.prepare(
                        job_id, seat.attempt, identity, node_rank=seat.node_rank
                    )
                    device = worker_device(self.settings.worker_device)
            except Exception as exc:
                logger.exception("job %s: could not prepare node %d", job_id, seat.node_rank)
                self._node_failed_outside_torchrun(seat, f"could not prepare the job: {exc}")
                return
            try:
                self._launch_and_watch(job, seat.attempt, directory, device, identity, seat)
            except Exception as exc:
                logger.exception("job %s: the supervisor failed on node %d", job_id, seat.node_rank)
                self._node_failed_outside_torchrun(seat, f"the worker could not run the job: {exc}")
        finally:
            remove_attempt_directory(root)

    def _node_failed_outside_torchrun(self, seat: NodeSeat, error: str) -> None:
        """This node cannot run: report it (the other nodes stop), and as the leader decide."""
        try:
            self.gang.report(
                seat,
                exit_code=1,
                error=f"node {seat.node_rank}: {error}",
                stopped=None,
                final_metrics=None,
            )
            if seat.is_leader:
                verdict = self.gang.collect(seat)
                if verdict is not None:
                    self._apply_verdict(seat, verdict)
        except Exception:
            logger.exception("job %s: could not report node %d", seat.job_id, seat.node_rank)
            if seat.is_leader:
                self._record(seat.job_id, seat.attempt, JobState.FAILED, error=error)

    def _launch_and_watch(
        self,
        job: Job,
        attempt: int,
        directory: JobDirectory,
        device: str,
        identity: JobIdentity | None = None,
        seat: NodeSeat | None = None,
    ) -> None:
        if seat is None:
            artifacts = self.artifact_sync(job, attempt, directory, identity)
        else:
            with self.gang.keep_alive(seat):  # (restoring large artifacts takes a while)
                artifacts = self.artifact_sync(job, attempt, directory, identity)
        nproc = int(job.num_processes) // (seat.nodes if seat is not None else 1)
        job_file = str(directory.visible(directory.job_file))
        if seat is None:
            command = torchrun_command(job_file, nproc)
        else:
            assert seat.endpoint is not None
            command = multinode_torchrun_command(
                job_file,
                nproc,
                nnodes=seat.nodes,
                endpoint=seat.endpoint,
                rendezvous_id=seat.rendezvous_id,
                is_host=seat.is_leader,
                local_addr=self.gang.host,
                join_timeout=self.settings.gang_wait_seconds,
            )
        env = sandbox_environment(
            rank_environment(device, nproc, self.settings.worker_slots),
            directory,
            _owner(identity),
            job.id,
        )
        if (
            seat is not None
        ):  # (unique among this machine's running nodes: see ace3.runtime.torchrun)
            env["ACE3_NODE_ID"] = str(os.getpid())
        process = launch(
            self.plan,
            directory,
            identity,
            command,
            env,
            share_network=seat is not None,  # (the rendezvous crosses machines)
            device=device,
            limits=self.limits,
        )
        limiter = LogLimiter(
            self.settings.max_log_lines_per_second,
            self.settings.max_log_bytes_per_second,
            self.settings.max_log_bytes_per_job,
        )
        lines: queue.Queue[reports.LogLine] = queue.Queue()
        pumps = [
            threading.Thread(
                target=_pump, args=(stream, name, lines, limiter), daemon=True, name=f"ace3-{name}"
            )
            for stream, name in (
                (process.process.stdout, "stdout"),
                (process.process.stderr, "stderr"),
            )
        ]
        for pump in pumps:
            pump.start()
        watch = AttemptWatch(job.id, attempt, syncs_artifacts=seat is None)
        events = reports.EventTail(directory.output_dir)
        max_runtime = job.config.get("max_runtime_seconds")
        if seat is None:  # (the leader of a multi-node job marked it running at the go)
            with self.sessions() as session:
                session.execute(job_transitions.mark_running(job.id, attempt))
                session.commit()

        def beat() -> None:
            if seat is None:
                self._heartbeat(watch, process)
            else:
                self._node_heartbeat(seat, watch, process)

        def ingest() -> None:
            self._ingest(job, directory, watch, lines, events, limiter)

        next_heartbeat = next_artifact_sync = 0.0
        try:
            while True:
                exited = process.poll() is not None
                if time.monotonic() >= next_heartbeat:
                    self._tolerating_database_errors(watch, process, beat)
                    next_heartbeat = time.monotonic() + self.settings.heartbeat_seconds
                if max_runtime and not exited:
                    self._enforce_max_runtime(watch, process, float(max_runtime))
                self._escalate(watch, process)
                self._tolerating_database_errors(watch, process, ingest)
                if time.monotonic() >= next_artifact_sync and not exited and watch.syncs_artifacts:
                    self._tolerating_database_errors(
                        watch, process, lambda: self._sync_artifacts(artifacts, lines)
                    )
                    next_artifact_sync = time.monotonic() + self.settings.artifact_sync_seconds
                if exited:
                    break
                time.sleep(POLL_SECONDS)
        finally:
            # Whatever happened, nothing of this attempt may outlive it.
            process.kill()
            process.wait()
            process.close()
            for pump in pumps:
                pump.join(timeout=10)
        returncode = process.returncode
        assert returncode is not None

        def drain() -> None:
            while self._ingest(job, directory, watch, lines, events, limiter):
                pass

        if seat is None:
            if not watch.lease_lost:
                self._final_artifact_sync(artifacts, lines)
            self._through_outage(watch, beat, drain)
            self._through_outage(
                watch, beat, lambda: self._record_outcome(job, watch, returncode, events)
            )
            return
        with self.gang.keep_alive(seat):
            if not watch.lease_lost and watch.syncs_artifacts:
                self._final_artifact_sync(artifacts, lines)
            self._through_outage(watch, beat, drain)
            self._report_node(seat, watch, returncode, events)
        self._decide_attempt(seat, watch)

    def _enforce_max_runtime(
        self, watch: AttemptWatch, process: SandboxedProcess, max_runtime: float
    ) -> None:
        elapsed = time.monotonic() - watch.started_at
        if elapsed <= max_runtime or watch.terminate_sent_at is not None:
            return
        watch.stopped_for = (
            f"the attempt ran past max_runtime_seconds={max_runtime:g} (stopped after "
            f"{elapsed:.0f} s)"
        )
        logger.warning("job %s attempt %d: %s", watch.job_id, watch.attempt, watch.stopped_for)
        process.terminate()
        watch.terminate_sent_at = time.monotonic()

    def _through_outage(
        self, watch: AttemptWatch, beat: Callable[[], None], action: Callable[[], None]
    ) -> None:
        """Run a last step of the attempt (store what is left, record the outcome) through a
        database outage, as the watch loop does: retried with the heartbeat until it works, or
        until the lease cannot be this attempt's any more (the reconciler then re-queues the
        job, which resumes from its last stored checkpoint)."""
        delay = POLL_SECONDS
        while True:
            try:
                if time.monotonic() - watch.lease_renewed_at > self.settings.heartbeat_seconds:
                    beat()
                action()
                return
            except DBAPIError as exc:
                waited = time.monotonic() - watch.lease_renewed_at
                if watch.lease_lost or waited > self.settings.lease_seconds:
                    logger.error(
                        "job %s attempt %d: database unreachable for %.0f s after the run; "
                        "giving the job up to the reconciler",
                        watch.job_id,
                        watch.attempt,
                        waited,
                    )
                    watch.lease_lost = True
                    return
                logger.warning(
                    "job %s: database unreachable (%s); retrying",
                    watch.job_id,
                    type(exc).__name__,
                )
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _sync_artifacts(self, artifacts: ArtifactSync, lines: queue.Queue[reports.LogLine]) -> None:
        """One artifact pass; what it has to tell the user goes to the job's log. A problem
        other than the database's never stops the job (the pass is retried)."""
        try:
            artifacts.sync(self.sessions)
        except DBAPIError:
            raise
        except Exception:
            logger.exception("job %s: artifact sync failed; retrying", artifacts.job_id)
        finally:
            for notice in artifacts.take_notices():
                lines.put(reports.LogLine("stdout", None, notice))

    def _final_artifact_sync(
        self, artifacts: ArtifactSync, lines: queue.Queue[reports.LogLine]
    ) -> None:
        """The files as the job left them, before its outcome is recorded (a few tries through
        a database hiccup; the outcome is recorded either way)."""
        for attempt_number in range(3):
            try:
                self._sync_artifacts(artifacts, lines)
                return
            except DBAPIError as exc:
                logger.warning(
                    "job %s: final artifact sync failed (%s)", artifacts.job_id, type(exc).__name__
                )
                time.sleep(POLL_SECONDS * (attempt_number + 1))

    def _tolerating_database_errors(
        self, watch: AttemptWatch, process: SandboxedProcess, action: Callable[[], None]
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
                watch.lease_lost
                or time.monotonic() - watch.lease_renewed_at <= self.settings.lease_seconds
            ):
                return
            logger.error(
                "job %s: lease not renewed for %.0f s: stopping",
                watch.job_id,
                self.settings.lease_seconds,
            )
            watch.lease_lost = True
            if watch.terminate_sent_at is None:
                process.terminate()
                watch.terminate_sent_at = time.monotonic()

    def _heartbeat(self, watch: AttemptWatch, process: SandboxedProcess) -> None:
        with self.sessions() as session:
            row = session.execute(
                job_transitions.renew_lease(
                    watch.job_id, watch.attempt, self.settings.lease_seconds
                )
            ).first()
            session.commit()
        if row is not None:
            watch.lease_renewed_at = time.monotonic()
        if row is None:
            if not watch.lease_lost:
                logger.error(
                    "job %s attempt %d lost its lease: stopping its processes",
                    watch.job_id,
                    watch.attempt,
                )
            watch.lease_lost = True
        elif row.cancel_requested:
            watch.cancel_requested = True
        if (watch.lease_lost or watch.cancel_requested) and watch.terminate_sent_at is None:
            process.terminate()
            watch.terminate_sent_at = time.monotonic()

    def _node_heartbeat(
        self, seat: NodeSeat, watch: AttemptWatch, process: SandboxedProcess
    ) -> None:
        """A multi-node heartbeat: this node's row (and, on the leader, the job's lease), the
        cancel flag, and the other nodes: one that failed or went silent stops this one too."""
        beat = self.gang.beat(seat)
        if beat.owned:
            watch.lease_renewed_at = time.monotonic()
        elif not watch.lease_lost:
            logger.error(
                "job %s attempt %d is no longer this attempt's: stopping node %d",
                seat.job_id,
                seat.attempt,
                seat.node_rank,
            )
            watch.lease_lost = True
        if beat.owned and beat.cancel_requested:
            watch.cancel_requested = True
        if beat.owned and beat.trouble and watch.peer_trouble is None:
            logger.warning(
                "job %s attempt %d: stopping node %d: %s",
                seat.job_id,
                seat.attempt,
                seat.node_rank,
                beat.trouble,
            )
            watch.peer_trouble = beat.trouble
        stop = watch.lease_lost or watch.cancel_requested or watch.peer_trouble is not None
        if stop and watch.terminate_sent_at is None:
            process.terminate()
            watch.terminate_sent_at = time.monotonic()

    def _escalate(self, watch: AttemptWatch, process: SandboxedProcess) -> None:
        if watch.terminate_sent_at is None or watch.killed or process.poll() is not None:
            return
        if time.monotonic() - watch.terminate_sent_at >= self.settings.cancel_grace_seconds:
            process.kill()
            watch.killed = True

    def _ingest(
        self,
        job: Job,
        directory: JobDirectory,
        watch: AttemptWatch,
        lines: queue.Queue[reports.LogLine],
        events: reports.EventTail,
        limiter: LogLimiter | None = None,
    ) -> bool:
        """Store one bounded batch of log lines and event records; return whether more were
        waiting (the caller's next pass takes them). Nothing is lost when the database is down:
        what was taken stays pending for the next pass."""
        batch: list[reports.LogLine] = []
        while len(watch.pending_lines) + len(batch) < LINES_PER_PASS:
            try:
                batch.append(lines.get_nowait())
            except queue.Empty:
                break
        more = not lines.empty()
        if limiter is not None and (dropped := limiter.take_dropped()) is not None:
            batch.append(_service_line(dropped))
        for item in batch:
            if item.rank == 0:
                watch.syncs_artifacts = True  # rank 0 (which writes the artifacts) is here
            if item.stream != "stderr":
                continue
            if item.rank is None:
                watch.launcher_stderr_tail.append(item.line)
            else:
                watch.rank_stderr_tail.append((item.rank, item.line))
        watch.pending_lines += batch
        if len(watch.pending_records) < RECORDS_PER_PASS:
            watch.pending_records += [
                self._take(watch, job, directory, events, record) for record in events.read_new()
            ]
        taken = watch.pending_records[:RECORDS_PER_PASS]
        more = more or events.has_more or len(watch.pending_records) > len(taken)
        if not watch.pending_lines and not taken:
            return more
        notices = [_service_line(item.notice) for item in taken if item.notice is not None]
        stale_keys: list[str] = []
        with self.sessions() as session:
            reports.store_log_lines(session, job.id, watch.attempt, watch.pending_lines + notices)
            for item in taken:
                if isinstance(item.record, MetricsRecord):
                    reports.store_metrics(session, job.id, item.record)
                elif item.plan is not None:
                    session.execute(
                        job_transitions.record_plan(
                            job.id, watch.attempt, item.plan.model_dump(mode="json")
                        )
                    )
                elif item.checkpoint is not None:
                    stale_keys += reports.record_checkpoint(
                        session,
                        self.store,
                        job.id,
                        watch.attempt,
                        item.checkpoint,
                        job.config.get("max_checkpoints"),
                    )
            session.commit()
        watch.pending_lines = []
        del watch.pending_records[: len(taken)]
        for key in stale_keys:
            self.store.delete(key)
        return more

    def _take(
        self,
        watch: AttemptWatch,
        job: Job,
        directory: JobDirectory,
        events: reports.EventTail,
        record: EventRecord | RefusedRecord,
    ) -> PendingRecord:
        """A record as it is read: a valid checkpoint's file is copied into the store now
        (once, whatever happens to the database meanwhile); what is refused gets its notice."""
        item = PendingRecord(record)
        if isinstance(record, RefusedRecord):
            item.notice = f"ace3: refused an events record ({record.reason}): {record.excerpt}"
        elif isinstance(record, StartRecord) and events.plan is record:
            item.plan = record.plan()  # (a later, larger plan is not accepted: reports.py)
        elif isinstance(record, NonFiniteLossRecord):
            item.notice = f"ace3: {record.metric} became {record.value} at step {record.step}"
        elif isinstance(record, CheckpointRecord):
            outcome = reports.checkpoint_problem(
                record, directory.visible(directory.checkpoints_dir), events.plan
            )
            if outcome is None and record.name in watch.staged_checkpoints:
                outcome = f"checkpoint {record.name} was already taken"
            outcome = outcome or reports.stage_checkpoint(
                self.store, job.id, record, directory.output_dir, self.settings.max_checkpoint_bytes
            )
            if isinstance(outcome, str):
                item.notice = f"ace3: refused a checkpoint record: {outcome}"
            else:
                watch.staged_checkpoints.add(record.name)
                item.checkpoint = outcome
        if item.notice is not None:
            # (a job that writes refused records without end gets a bounded number of lines)
            watch.notices_left -= 1
            if watch.notices_left < 0:
                item.notice = None
            elif watch.notices_left == 0:
                item.notice += (
                    f" (the last of {MAX_NOTICES_PER_ATTEMPT} refusals logged for this attempt;"
                    " later ones are not)"
                )
        if item.notice is not None:
            logger.warning("job %s: %s", job.id, item.notice)
        return item

    # -- outcome ---------------------------------------------------------------------------------
    def _failure(self, watch: AttemptWatch, returncode: int) -> tuple[str, bool]:
        """(the failure's message, whether another attempt may help)."""
        cause = root_cause(watch.launcher_stderr_tail, watch.rank_stderr_tail)
        if watch.stopped_for is not None:
            return f"training stopped: {watch.stopped_for}", False
        if cause is not None and cause.signal is not None:
            return self._message(returncode, watch, cause), cause.retryable
        if returncode < 0:
            # torchrun itself was killed by a signal (not ours): the machine, not the code, failed.
            return f"the torchrun process was killed by signal {-returncode}", True
        return self._message(returncode, watch, cause), False

    def _message(self, returncode: int, watch: AttemptWatch, cause: RankFailure | None) -> str:
        return failure_message(
            returncode, watch.rank_stderr_tail, watch.launcher_stderr_tail, cause, self.limits
        )

    def _record_outcome(
        self, job: Job, watch: AttemptWatch, returncode: int, events: reports.EventTail
    ) -> None:
        if watch.lease_lost:
            logger.warning(
                "job %s attempt %d: lease lost; its outcome belongs to a newer attempt",
                job.id,
                watch.attempt,
            )
            return
        final_metrics = _final_metrics(events)
        if watch.cancel_requested:
            self._record(
                job.id,
                watch.attempt,
                JobState.CANCELLED,
                exit_code=returncode,
                final_metrics=final_metrics,
            )
            return
        if returncode == 0 and watch.stopped_for is None:
            self._record(
                job.id, watch.attempt, JobState.SUCCEEDED, exit_code=0, final_metrics=final_metrics
            )
            return
        if self._ran_out_of_memory(watch) and self._halve_micro_batch(job, watch.attempt):
            return
        error, retryable = self._failure(watch, returncode)
        if retryable and self._retry(job.id, watch.attempt, error):
            headline = error.partition("\n")[0]
            logger.warning("job %s attempt %d: %s; retrying", job.id, watch.attempt, headline)
            with self.sessions() as session:
                reports.store_log_lines(
                    session,
                    job.id,
                    watch.attempt,
                    [_service_line(f"ace3: attempt {watch.attempt} ended: {headline}; retrying")],
                )
                session.commit()
            return
        if retryable:
            headline, newline, rest = error.partition("\n")
            error = f"{headline}; no retries left{newline}{rest}"
        self._record(
            job.id,
            watch.attempt,
            JobState.FAILED,
            exit_code=returncode,
            error=error,
            final_metrics=final_metrics,
        )

    def _report_node(
        self, seat: NodeSeat, watch: AttemptWatch, returncode: int, events: reports.EventTail
    ) -> None:
        """Report how this node's torchrun ended, and why the service stopped it if it did.
        A rank killed by a signal is reported as a signal exit (the verdict then retries)."""
        if watch.cancel_requested:
            stopped: str | None = "the job was cancelled"
        elif watch.peer_trouble is not None:
            stopped = watch.peer_trouble
        elif watch.lease_lost:
            stopped = "the attempt no longer owns the job"
        else:
            stopped = None
        error = None
        if returncode != 0 or watch.stopped_for is not None:
            error, retryable = self._failure(watch, returncode)
            cause = root_cause(watch.launcher_stderr_tail, watch.rank_stderr_tail)
            if retryable and cause is not None and cause.signal is not None and stopped is None:
                returncode = cause.exit_code
            elif stopped is None and self._ran_out_of_memory(watch):
                returncode = OUT_OF_MEMORY_EXIT_CODE  # (the verdict halves the micro-batch)
            elif returncode == 0:
                returncode = 1  # stopped by the service on its own: a failure of this node
        self.gang.report(
            seat,
            exit_code=returncode,
            error=error,
            stopped=stopped,
            final_metrics=_final_metrics(events),
        )

    def _decide_attempt(self, seat: NodeSeat, watch: AttemptWatch) -> None:
        """The leader waits for every node's report (or its silence) and records the attempt."""
        if not seat.is_leader or watch.lease_lost:
            return
        verdict = self.gang.collect(seat)
        if verdict is None:
            logger.warning(
                "job %s attempt %d: lease lost while collecting", seat.job_id, seat.attempt
            )
            return
        self._apply_verdict(seat, verdict)

    def _apply_verdict(self, seat: NodeSeat, verdict: job_nodes.Verdict) -> None:
        if verdict.outcome == "out_of_memory":
            with self.sessions() as session:
                job = session.get(Job, seat.job_id)
                if job is not None:
                    session.expunge(job)
            if job is not None and self._halve_micro_batch(job, seat.attempt):
                return
            verdict = dataclasses.replace(verdict, outcome="failed")
        if verdict.outcome == "retry":
            reason = verdict.error or "a node of the attempt was lost"
            if not self._retry(seat.job_id, seat.attempt, reason):
                self._record(
                    seat.job_id,
                    seat.attempt,
                    JobState.FAILED,
                    exit_code=verdict.exit_code,
                    error=reason + "; no retries left",
                )
            return
        self._record(
            seat.job_id,
            seat.attempt,
            JobState(verdict.outcome),
            exit_code=verdict.exit_code,
            error=verdict.error,
            final_metrics=verdict.final_metrics,
        )

    def _retry(self, job_id: str, attempt: int, reason: str) -> bool:
        with self.sessions() as session:
            result = session.execute(job_transitions.requeue_for_retry(job_id, attempt, reason))
            session.commit()
        if not result.rowcount:
            return False
        self._publish(job_id)
        return True

    @staticmethod
    def _ran_out_of_memory(watch: AttemptWatch) -> bool:
        """A rank left with OUT_OF_MEMORY_EXIT_CODE: it ran out of memory inside a step of a
        multi-process job (ace3.runtime.steps), and torchrun stopped the others. Any rank of
        torchrun's summary counts, not only its root cause: a peer waiting in the all-reduce can
        fail first on the closed connection ("Connection closed by peer")."""
        if watch.stopped_for is not None:
            return False
        return any(
            failure.exit_code == OUT_OF_MEMORY_EXIT_CODE
            for failure in failed_ranks(watch.launcher_stderr_tail)
        )

    def _halve_micro_batch(self, job: Job, attempt: int) -> bool:
        """Queue the next attempt with twice the micro-batch split (job.json), from the job's
        newest checkpoint; False when the micro-batch cannot be halved again (the attempt then
        fails like any other). The update itself bounds the halvings by
        :func:`max_micro_batch_halvings`, whatever a job's exit status claims."""
        limit = max_micro_batch_halvings(job.config, job.num_processes)
        split = 2 ** ((job.micro_batch_halvings or 0) + 1)
        reason = (
            f"attempt {attempt} ran out of memory inside a training step; the next one runs "
            f"micro-batch split {split} (the effective batch unchanged)"
        )
        with self.sessions() as session:
            result = session.execute(
                job_transitions.requeue_with_half_the_micro_batch(job.id, attempt, reason, limit)
            )
            if result.rowcount:
                reports.store_log_lines(
                    session, job.id, attempt, [_service_line(f"ace3: {reason}; retrying")]
                )
            session.commit()
        if not result.rowcount:
            return False
        logger.warning("job %s: %s", job.id, reason)
        self._publish(job.id)
        return True

    def _publish(self, job_id: str) -> None:
        publish(
            self.settings,
            job_id,
            on_failure="retry queued but not published; the reconciler will publish it",
        )

    def _record_surviving_outage(
        self, job_id: str, attempt: int, state: JobState, **fields: Any
    ) -> None:
        """:meth:`_record`, retried through a database outage for up to a lease (after that the
        reconciler re-queues the job anyway)."""
        deadline = time.monotonic() + self.settings.lease_seconds
        delay = POLL_SECONDS
        while True:
            try:
                self._record(job_id, attempt, state, **fields)
                return
            except DBAPIError:
                if time.monotonic() > deadline:
                    logger.exception("job %s attempt %d: outcome not recorded", job_id, attempt)
                    return
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _record(self, job_id: str, attempt: int, state: JobState, **fields: Any) -> None:
        with self.sessions() as session:
            result = session.execute(job_transitions.finish(job_id, attempt, state, **fields))
            session.commit()
        if result.rowcount:
            logger.info("job %s attempt %d: %s", job_id, attempt, state.value)
        else:
            logger.warning(
                "job %s attempt %d: not recorded as %s (no longer ours)",
                job_id,
                attempt,
                state.value,
            )


def resume_checkpoint(session: Session, job: Job, attempt: int) -> JobCheckpoint | None:
    """What an attempt resumes from: after the first, the job's own newest checkpoint when it
    has one; else the stored checkpoint the job was created from (``resume_from_checkpoint``)."""
    if attempt > 1:
        own = reports.latest_checkpoint(session, job.id)
        if own is not None:
            return own
    if job.resume_from_checkpoint_id is None:
        return None
    origin = session.get(JobCheckpoint, job.resume_from_checkpoint_id)
    if origin is None:
        raise FileNotFoundError(
            f"checkpoint {job.resume_from_checkpoint_id}, which this job starts from, is gone"
        )
    return origin


def _final_metrics(events: reports.EventTail) -> dict[str, Any] | None:
    """The runtime's final metrics (they include best_val_accuracy, steps and epochs)."""
    return dict(events.summary.final_metrics) if events.summary is not None else None


def _owner(identity: JobIdentity | None) -> JobOwner | None:
    return JobOwner(identity.uid, identity.gid, identity.user_name) if identity else None


def run_job(job_id: str, node_id: str | None = None) -> None:
    """Run one message's job on a supervisor of its own (the Celery task keeps one per worker
    process instead: :mod:`ace3_worker.tasks`)."""
    Supervisor(get_settings(), node_id).run(job_id)
