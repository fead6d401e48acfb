"""Storing what a running attempt produces: its log lines, its events records (metrics, the run
plan, checkpoints, the typed instability, preempted and eval_samples records, refusals; the ranks' failure
records are kept for the failure's message) and its artifacts.

Everything the job writes is untrusted: events are validated (:mod:`ace3.config.events`) and a refused
one becomes a warning in the job's log (stream ``service``, which a job cannot write);
checkpoints are read only from the attempt's checkpoint directory and never deleted there. Each
pass stores a bounded batch, so a job that prints without end cannot starve the heartbeat, and
nothing is lost while the database is down: what was read stays pending for the next pass.
"""

from __future__ import annotations

import logging
import queue
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from sqlalchemy import delete, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from ace3.config.events import (
    CheckpointRecord,
    EvalSamplesRecord,
    EventRecord,
    InstabilityRecord,
    MetricsRecord,
    NonFiniteLossRecord,
    PreemptedRecord,
    RankFailureRecord,
    RefusedRecord,
    RunPlan,
    StartRecord,
)
from ace3_control import job_transitions
from ace3_control.models import Job, JobRecord, utcnow
from ace3_control.settings import Settings
from ace3_control.storage import ArtifactStore
from ace3_worker import checkpoints, reports
from ace3_worker.artifact_sync import ArtifactSync
from ace3_worker.attempt import (
    ERROR_TAIL_LINES,
    MAX_EVAL_SAMPLE_RECORDS_PER_ATTEMPT,
    MAX_GUARD_NOTICES_PER_ATTEMPT,
    MAX_NOTICES_PER_ATTEMPT,
    MAX_RANK_FAILURES_PER_ATTEMPT,
    MAX_TYPED_RECORDS_PER_ATTEMPT,
    POLL_SECONDS,
)
from ace3_worker.job_dir import JobDirectory
from ace3_worker.log_limits import LogLimiter

logger = logging.getLogger(__name__)

# What one pass of the watch loop stores at most (the rest waits for the next pass).
LINES_PER_PASS = 2000
RECORDS_PER_PASS = 500
SERVICE_STREAM = "service"  # the worker's own notices in a job's log (a job cannot write it)
FINAL_SYNC_TRIES = 3


@dataclass
class PendingRecord:
    """An events record read but not yet stored, with what reading it decided."""

    record: EventRecord | RefusedRecord
    # a valid checkpoint, copied to the store
    checkpoint: checkpoints.StagedCheckpoint | None = None
    notice: str | None = None  # the warning for the job's log
    plan: RunPlan | None = None  # an accepted start record's plan, for the job row
    typed: bool = False  # an instability, preempted or eval_samples record for job_records


@dataclass
class JobOutput:
    """What the attempt's output told the worker, and what of it is not stored yet. Written by
    :class:`Ingest` only; the watch loop and the outcome read it."""

    # Whether this worker syncs the artifacts: the node that hosts rank 0 (the only one on a
    # single-node job; on a multi-node job, the node whose torchrun prints rank 0's lines).
    syncs_artifacts: bool = True
    # The ranks' own stderr (user tracebacks) apart from torchrun's, which only summarises them.
    rank_stderr_tail: deque[tuple[int, str]] = field(
        default_factory=lambda: deque(maxlen=ERROR_TAIL_LINES)
    )
    launcher_stderr_tail: deque[str] = field(default_factory=lambda: deque(maxlen=ERROR_TAIL_LINES))
    # The ranks' failure records, earliest first (at most MAX_RANK_FAILURES_PER_ATTEMPT).
    rank_failures: list[RankFailureRecord] = field(default_factory=list)
    # Drained but not yet stored (the database was unreachable): retried on the next pass.
    pending_lines: list[reports.LogLine] = field(default_factory=list)
    pending_records: list[PendingRecord] = field(default_factory=list)
    # Checkpoint files already copied into the store (a repeated record is not copied again).
    staged_checkpoints: set[str] = field(default_factory=set)
    notices_left: int = MAX_NOTICES_PER_ATTEMPT
    guard_notices_left: int = MAX_GUARD_NOTICES_PER_ATTEMPT
    typed_records_left: int = MAX_TYPED_RECORDS_PER_ATTEMPT
    typed_records_dropped: int = 0  # past the bound: counted, not stored
    # eval_samples slots left; once none is, each new one replaces the attempt's oldest
    eval_sample_records_left: int = MAX_EVAL_SAMPLE_RECORDS_PER_ATTEMPT
    eval_samples_dropped: int = 0  # not stored: the typed records' bound ran out first


class IngestTarget(Protocol):
    """What the ingest needs of an attempt (:class:`ace3_worker.watch.AttemptWatch`): its
    number, and the :class:`JobOutput` it writes."""

    @property
    def attempt(self) -> int: ...

    @property
    def output(self) -> JobOutput: ...


def service_line(text: str) -> reports.LogLine:
    """A line of the worker's own (which may quote what a job wrote)."""
    return reports.LogLine(
        SERVICE_STREAM, None, reports.storable_text(text[: reports.MAX_LINE_CHARS])
    )


def instability_notice(record: InstabilityRecord) -> str:
    """The job log's line for an instability record (the record is validated: bounded, no
    control characters)."""
    done = {
        "warn": "step applied (warn)",
        "skip": "step skipped",
        "rollback": f"rolled back to the checkpoint of step {record.rolled_back_to_step}, "
        f"learning rate x{record.lr_scale:g}",
        "stop": "run stopped",
    }[record.action]
    return f"ace3: training instability at step {record.step}: {record.reason}; {done}"


TypedRecord = InstabilityRecord | PreemptedRecord | EvalSamplesRecord


def store_typed_record(session: Session, job_id: str, attempt: int, record: TypedRecord) -> None:
    """Keep a validated instability, preempted or eval_samples record in job_records (the API's
    ``GET /v1/jobs/{id}/records`` and the event stream's ``record`` events)."""
    session.add(
        JobRecord(
            job_id=job_id,
            attempt=attempt,
            type=record.type,
            step=record.step,
            payload=record.model_dump(mode="json"),
            created_at=utcnow(),
        )
    )


def keep_newest_eval_samples(session: Session, job_id: str, attempt: int) -> None:
    """Delete the attempt's eval_samples records older than its newest
    MAX_EVAL_SAMPLE_RECORDS_PER_ATTEMPT (one statement a batch; what it deletes is at most
    what the batch added)."""
    session.flush()
    mine = (
        JobRecord.job_id == job_id,
        JobRecord.attempt == attempt,
        JobRecord.type == "eval_samples",
    )
    cutoff = (
        select(JobRecord.id)
        .where(*mine)
        .order_by(JobRecord.id.desc())
        .offset(MAX_EVAL_SAMPLE_RECORDS_PER_ATTEMPT)
        .limit(1)
        .scalar_subquery()
    )
    session.execute(delete(JobRecord).where(*mine, JobRecord.id <= cutoff))


class Ingest:
    """Stores one attempt's output into the database and the artifact store."""

    def __init__(
        self, settings: Settings, sessions: sessionmaker[Session], store: ArtifactStore
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.store = store

    def store_batch(
        self,
        job: Job,
        directory: JobDirectory,
        watch: IngestTarget,
        lines: queue.Queue[reports.LogLine],
        events: reports.EventTail,
        limiter: LogLimiter | None = None,
    ) -> bool:
        """Store one bounded batch of log lines and event records; return whether more were
        waiting (the caller's next pass takes them). Nothing is lost when the database is down:
        what was taken stays pending for the next pass."""
        output = watch.output
        batch: list[reports.LogLine] = []
        while len(output.pending_lines) + len(batch) < LINES_PER_PASS:
            try:
                batch.append(lines.get_nowait())
            except queue.Empty:
                break
        more = not lines.empty()
        if limiter is not None and (dropped := limiter.take_dropped()) is not None:
            batch.append(service_line(dropped))
        for line in batch:
            if line.rank == 0:
                output.syncs_artifacts = True  # rank 0 (which writes the artifacts) is here
            if line.stream != "stderr":
                continue
            if line.rank is None:
                output.launcher_stderr_tail.append(line.line)
            else:
                output.rank_stderr_tail.append((line.rank, line.line))
        output.pending_lines += batch
        if len(output.pending_records) < RECORDS_PER_PASS:
            output.pending_records += [
                self._take(output, job, directory, events, record) for record in events.read_new()
            ]
        taken = output.pending_records[:RECORDS_PER_PASS]
        more = more or events.has_more or len(output.pending_records) > len(taken)
        if not output.pending_lines and not taken:
            return more
        notices = [service_line(item.notice) for item in taken if item.notice is not None]
        stale_keys: list[str] = []
        with self.sessions() as session:
            reports.store_log_lines(session, job.id, watch.attempt, output.pending_lines + notices)
            samples = False
            for item in taken:
                if isinstance(item.record, MetricsRecord):
                    reports.store_metrics(session, job.id, item.record)
                elif item.typed and isinstance(item.record, TypedRecord):
                    store_typed_record(session, job.id, watch.attempt, item.record)
                    samples = samples or isinstance(item.record, EvalSamplesRecord)
                elif item.plan is not None:
                    session.execute(
                        job_transitions.record_plan(
                            job.id, watch.attempt, item.plan.model_dump(mode="json")
                        )
                    )
                elif item.checkpoint is not None:
                    stale_keys += checkpoints.record_checkpoint(
                        session,
                        self.store,
                        job.id,
                        watch.attempt,
                        item.checkpoint,
                        job.config.get("max_checkpoints"),
                        checkpoints.best_by(job.config),
                    )
            if samples and output.eval_sample_records_left <= 0:
                keep_newest_eval_samples(session, job.id, watch.attempt)
            session.commit()
        output.pending_lines = []
        del output.pending_records[: len(taken)]
        for key in stale_keys:
            self.store.delete(key)
        return more

    def _take(
        self,
        output: JobOutput,
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
        elif isinstance(record, InstabilityRecord | PreemptedRecord):
            self._take_typed(output, job, item, record)
            return item
        elif isinstance(record, EvalSamplesRecord):
            # (no line in the job's log: the samples are the record; past the bound, each
            # replaces the attempt's oldest, so the newest are kept)
            if output.eval_sample_records_left <= 0 or output.typed_records_left > 0:
                if output.eval_sample_records_left > 0:
                    output.eval_sample_records_left -= 1
                    output.typed_records_left -= 1
                item.typed = True
                return item
            output.typed_records_dropped += 1
            output.eval_samples_dropped += 1
            if output.eval_samples_dropped > 1:
                return item
            item.notice = (
                f"ace3: the eval_samples record of step {record.step} is not kept, nor later "
                f"ones: this attempt's typed records reached their bound of "
                f"{MAX_TYPED_RECORDS_PER_ATTEMPT}"
            )
        elif isinstance(record, RankFailureRecord):
            output.rank_failures = sorted(
                [*output.rank_failures, record], key=lambda kept: (kept.time_ns, kept.rank)
            )[:MAX_RANK_FAILURES_PER_ATTEMPT]
        elif isinstance(record, CheckpointRecord):
            outcome: str | checkpoints.StagedCheckpoint | None = checkpoints.checkpoint_problem(
                record, directory.visible(directory.checkpoints_dir), events.plan
            )
            if outcome is None and record.name in output.staged_checkpoints:
                outcome = f"checkpoint {record.name} was already taken"
            outcome = outcome or checkpoints.stage_checkpoint(
                self.store, job.id, record, directory.output_dir, self.settings.max_checkpoint_bytes
            )
            if isinstance(outcome, str):
                item.notice = f"ace3: refused a checkpoint record: {outcome}"
            else:
                output.staged_checkpoints.add(record.name)
                item.checkpoint = outcome
        if item.notice is not None:
            # (a job that writes refused records without end gets a bounded number of lines)
            output.notices_left -= 1
            if output.notices_left < 0:
                item.notice = None
            elif output.notices_left == 0:
                item.notice += (
                    f" (the last of {MAX_NOTICES_PER_ATTEMPT} refusals logged for this attempt;"
                    " later ones are not)"
                )
        if item.notice is not None:
            logger.warning("job %s: %s", job.id, item.notice)
        return item

    def _take_typed(
        self,
        output: JobOutput,
        job: Job,
        item: PendingRecord,
        record: InstabilityRecord | PreemptedRecord,
    ) -> None:
        """An instability or preempted record: stored in job_records (at most
        MAX_TYPED_RECORDS_PER_ATTEMPT an attempt, the rest counted) and told in the job's log
        within a notice budget of its own (apart from the refusals')."""
        if output.typed_records_left > 0:
            output.typed_records_left -= 1
            item.typed = True
        else:
            output.typed_records_dropped += 1
        output.guard_notices_left -= 1
        if output.guard_notices_left < 0:
            return
        if isinstance(record, InstabilityRecord):
            item.notice = instability_notice(record)
        else:
            saved = f"checkpoint {record.checkpoint}" if record.checkpoint else "no checkpoint"
            item.notice = f"ace3: the run was preempted (SIGTERM) after step {record.step}: {saved}"
        if output.guard_notices_left == 0:
            item.notice += (
                f" (the last of {MAX_GUARD_NOTICES_PER_ATTEMPT} instability and preemption"
                f" notices logged for this attempt; later ones are not, and at most"
                f" {MAX_TYPED_RECORDS_PER_ATTEMPT} records are kept)"
            )
        logger.warning("job %s: %s", job.id, item.notice)

    # -- artifacts -------------------------------------------------------------------------------
    def sync_artifacts(self, artifacts: ArtifactSync, lines: queue.Queue[reports.LogLine]) -> None:
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
                lines.put(service_line(notice))

    def final_artifact_sync(
        self, artifacts: ArtifactSync, lines: queue.Queue[reports.LogLine]
    ) -> None:
        """The files as the job left them, before its outcome is recorded (a few tries through
        a database hiccup; the outcome is recorded either way)."""
        for attempt_number in range(FINAL_SYNC_TRIES):
            try:
                self.sync_artifacts(artifacts, lines)
                return
            except DBAPIError as exc:
                logger.warning(
                    "job %s: final artifact sync failed (%s)", artifacts.job_id, type(exc).__name__
                )
                time.sleep(POLL_SECONDS * (attempt_number + 1))
