"""How an attempt ended, written to the job's row: succeeded, cancelled, failed (with the
failing rank's error), re-queued for a retry, re-queued with half the micro-batch after
running out of memory, or re-queued after a preemption (the worker was drained; not a retry).

Every write is a conditional update fenced by the attempt number
(``ace3_control.job_transitions``), so a worker that lost its lease changes nothing. A
single-node attempt is decided here from its own exit (:meth:`Outcomes.record_attempt`); a
multi-node attempt's nodes each report their exit (:meth:`Outcomes.node_exit`) and the leader
applies the verdict of ``ace3_control.job_nodes`` (:meth:`Outcomes.apply_verdict`).
"""

from __future__ import annotations

import dataclasses
import logging
import signal
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from ace3.config import TrainingConfig, parallel_degrees, runs_pipeline
from ace3.config.batch_growth import batch_growth
from ace3.errors import OUT_OF_MEMORY_EXIT_CODE, PREEMPTED_EXIT_CODE
from ace3_control import job_nodes, job_transitions
from ace3_control.db import rows_changed
from ace3_control.models import Job, JobState
from ace3_control.settings import Settings
from ace3_worker import checkpoints, reports
from ace3_worker.drain import draining
from ace3_worker.export_registration import ExportRegistrar
from ace3_worker.failures import RankFailure, failed_ranks, failure_message, root_cause
from ace3_worker.ingest import service_line
from ace3_worker.messages import publish
from ace3_worker.outcome_writer import OutcomeWriter
from ace3_worker.sandbox.limits import JobLimits
from ace3_worker.watch import AttemptWatch

logger = logging.getLogger(__name__)


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
    # tensor parallelism groups them). With batch-size growth a step's micro-batch is as large
    # as the path's largest size (ace3.runtime.loop.batch_growth).
    growth = batch_growth(settings)
    batch = max(settings.batch_size, growth.target_batch_size if growth else 0)
    processes = max(1, num_processes)
    stages, ways = parallel_degrees(settings, processes)
    per_rank = max(1, batch // max(1, processes // (stages * ways)))
    return max(0, per_rank.bit_length() - 1)


def final_metrics(events: reports.EventTail) -> dict[str, Any] | None:
    """The runtime's final metrics (they include best_val_accuracy, steps and epochs)."""
    return dict(events.summary.final_metrics) if events.summary is not None else None


def ran_out_of_memory(watch: AttemptWatch) -> bool:
    """The worker stopped the attempt for the job's memory limit (ace3_worker.usage_monitor), or
    a rank left with OUT_OF_MEMORY_EXIT_CODE: it ran out of memory inside a step of a
    multi-process job (ace3.runtime.loop.steps), and torchrun stopped the others. Any rank of
    torchrun's summary counts, not only its root cause: a peer waiting in the all-reduce can
    fail first on the closed connection ("Connection closed by peer")."""
    if watch.run.out_of_memory:
        return True
    if watch.run.stopped_for is not None:
        return False
    return any(
        failure.exit_code == OUT_OF_MEMORY_EXIT_CODE
        for failure in failed_ranks(watch.output.launcher_stderr_tail)
    )


def preempted_from_outside(watch: AttemptWatch) -> bool:
    """A rank left with PREEMPTED_EXIT_CODE while this worker did not preempt it: a SIGTERM
    from outside the worker reached the ranks (a spot notice to the machine), and they
    checkpointed. Another attempt may help, but the exit status is the job's own claim: it
    counts against the retry budget (only the worker's own drain does not)."""
    if watch.run.stopped_for is not None or watch.run.preempted_for is not None:
        return False
    # Every failed rank: when one rank crashes, torchrun sends SIGTERM to the others, which
    # then checkpoint and leave with this code too; the crash is the cause, not a preemption.
    failures = failed_ranks(watch.output.launcher_stderr_tail)
    return bool(failures) and all(f.exit_code == PREEMPTED_EXIT_CODE for f in failures)


def drain_preemption(watch: AttemptWatch) -> str | None:
    """Why this worker preempted the attempt, if it did (None: it did not). While this worker
    drains, ranks that left with PREEMPTED_EXIT_CODE before its watch loop preempted them (the
    drain's SIGTERM reached them first: systemd's ``KillMode=control-group``, a spot shutdown
    signalling every process) were preempted by this worker all the same: re-queued outside the
    retry budget."""
    if watch.run.preempted_for is not None:
        return watch.run.preempted_for
    if draining() and watch.run.preemptible and preempted_from_outside(watch):
        return "the worker is draining (its SIGTERM reached the ranks first)"
    return None


@dataclasses.dataclass(frozen=True)
class NodeExit:
    """What a node of a multi-node attempt reports about its torchrun."""

    exit_code: int
    error: str | None
    stopped: str | None  # why the service stopped this node, if it did


class Outcomes(OutcomeWriter):
    """Records attempts' outcomes for one worker process."""

    def __init__(
        self,
        settings: Settings,
        sessions: sessionmaker[Session],
        limits: JobLimits,
        exports: ExportRegistrar | None = None,
    ) -> None:
        super().__init__(settings, sessions, exports)
        self.limits = limits

    # -- reading the exit ------------------------------------------------------------------------
    def failure(self, watch: AttemptWatch, returncode: int) -> tuple[str, bool]:
        """(the failure's message, whether another attempt may help)."""
        cause = root_cause(watch.output.launcher_stderr_tail, watch.output.rank_stderr_tail)
        if watch.run.stopped_for is not None:
            return f"training stopped: {watch.run.stopped_for}", False
        if preempted_from_outside(watch):
            return (
                f"the ranks were preempted by a SIGTERM from outside the worker (exit code "
                f"{PREEMPTED_EXIT_CODE}) and wrote a checkpoint",
                True,
            )
        if cause is not None and cause.signal is not None:
            return self._message(returncode, watch, cause), cause.retryable
        if returncode < 0:
            # torchrun itself was killed by a signal (not ours): the machine, not the code, failed.
            return f"the torchrun process was killed by signal {-returncode}", True
        return self._message(returncode, watch, cause), False

    def _message(self, returncode: int, watch: AttemptWatch, cause: RankFailure | None) -> str:
        return failure_message(
            returncode,
            watch.output.rank_stderr_tail,
            watch.output.launcher_stderr_tail,
            cause,
            self.limits,
            watch.output.rank_failures,
        )

    def node_exit(
        self, watch: AttemptWatch, returncode: int, cancelled_at_exit: bool = False
    ) -> NodeExit:
        """How this node's torchrun ended, and why the service stopped it if it did (a cancel
        the watch loop saw, or one read at exit: ``cancelled_at_exit``). A rank killed by a
        signal is reported as a signal exit (the verdict then retries)."""
        if watch.run.cancel_requested or cancelled_at_exit:
            stopped: str | None = "the job was cancelled"
        elif watch.run.peer_trouble is not None:
            stopped = watch.run.peer_trouble
        elif watch.run.lease_lost:
            stopped = "the attempt no longer owns the job"
        else:
            stopped = None
        error = None
        if returncode != 0 or watch.run.stopped_for is not None:
            error, retryable = self.failure(watch, returncode)
            cause = root_cause(watch.output.launcher_stderr_tail, watch.output.rank_stderr_tail)
            if retryable and cause is not None and cause.signal is not None and stopped is None:
                returncode = cause.exit_code
            elif stopped is None and ran_out_of_memory(watch):
                returncode = OUT_OF_MEMORY_EXIT_CODE  # (the verdict halves the micro-batch)
            elif stopped is None and preempted_from_outside(watch):
                returncode = -int(signal.SIGTERM)  # (the verdict retries it, from the budget)
            elif returncode == 0 or watch.run.stopped_for is not None:
                returncode = 1  # stopped by the service on its own (not a signal to retry)
        return NodeExit(returncode, error, stopped)

    # -- deciding --------------------------------------------------------------------------------
    def record_attempt(
        self, job: Job, watch: AttemptWatch, returncode: int, events: reports.EventTail
    ) -> None:
        """Decide a single-node attempt from its own exit."""
        if watch.run.lease_lost:
            logger.warning(
                "job %s attempt %d: lease lost; its outcome belongs to a newer attempt",
                job.id,
                watch.attempt,
            )
            return
        metrics = final_metrics(events)
        preempted_for = drain_preemption(watch)
        if watch.run.cancel_requested:
            self.record(
                job.id,
                watch.attempt,
                JobState.CANCELLED,
                exit_code=returncode,
                final_metrics=metrics,
            )
            return
        done = returncode == 0 or (preempted_for is not None and metrics is not None)
        if done and watch.run.stopped_for is None:  # (preempted after its summary: it finished)
            self.record(
                job.id, watch.attempt, JobState.SUCCEEDED, exit_code=0, final_metrics=metrics
            )
            return
        if preempted_for is not None:
            self.requeue_preempted(job, watch.attempt, preempted_for, returncode)
            return
        if ran_out_of_memory(watch) and self.halve_micro_batch(
            job, watch.attempt, watch.run.stopped_for if watch.run.out_of_memory else None
        ):
            return
        error, retryable = self.failure(watch, returncode)
        if retryable and self.retry(job.id, watch.attempt, error):
            headline = error.partition("\n")[0]
            logger.warning("job %s attempt %d: %s; retrying", job.id, watch.attempt, headline)
            with self.sessions() as session:
                reports.store_log_lines(
                    session,
                    job.id,
                    watch.attempt,
                    [service_line(f"ace3: attempt {watch.attempt} ended: {headline}; retrying")],
                )
                session.commit()
            return
        if retryable:
            headline, newline, rest = error.partition("\n")
            error = f"{headline}; no retries left{newline}{rest}"
        self.record(
            job.id,
            watch.attempt,
            JobState.FAILED,
            exit_code=returncode,
            error=error,
            final_metrics=metrics,
        )

    def apply_verdict(self, job_id: str, attempt: int, verdict: job_nodes.Verdict) -> None:
        """Record a multi-node attempt as its leader decided it from every node's report."""
        if verdict.outcome == "out_of_memory":
            with self.sessions() as session:
                job = session.get(Job, job_id)
                if job is not None:
                    session.expunge(job)
            if job is not None and self.halve_micro_batch(job, attempt):
                return
            verdict = dataclasses.replace(verdict, outcome="failed")
        if verdict.outcome == "retry":
            reason = verdict.error or "a node of the attempt was lost"
            if not self.retry(job_id, attempt, reason):
                self.record(
                    job_id,
                    attempt,
                    JobState.FAILED,
                    exit_code=verdict.exit_code,
                    error=reason + "; no retries left",
                )
            return
        self.record_surviving_outage(
            job_id,
            attempt,
            JobState(verdict.outcome),
            exit_code=verdict.exit_code,
            error=verdict.error,
            final_metrics=verdict.final_metrics,
        )

    # -- re-queueing -----------------------------------------------------------------------------
    def retry(self, job_id: str, attempt: int, reason: str) -> bool:
        with self.sessions() as session:
            result = session.execute(job_transitions.requeue_for_retry(job_id, attempt, reason))
            session.commit()
        if not rows_changed(result):
            return False
        self._publish(job_id)
        return True

    def requeue_preempted(self, job: Job, attempt: int, why: str, returncode: int) -> None:
        """The attempt was preempted: queue the next one (it resumes from the newest verified
        checkpoint, which the drain stored before this) without using up the retry budget. A
        cancel asked meanwhile wins: the job is cancelled instead; past
        ``ACE3_MAX_PREEMPTIONS`` the job fails, saying so."""
        with self.sessions() as session:
            newest = checkpoints.latest_checkpoint(session, job.id)
            resumes = (
                f"the next attempt resumes from checkpoint {newest.name} (step {newest.step})"
                if newest is not None
                else "the next attempt starts over (no checkpoint was stored)"
            )
            reason = f"attempt {attempt} was preempted ({why}); {resumes}"
            result = session.execute(
                job_transitions.requeue_after_preemption(
                    job.id, attempt, reason, self.settings.max_preemptions
                )
            )
            row = session.get(Job, job.id) if not rows_changed(result) else None
            cancel_asked = row is not None and bool(row.cancel_requested)
            if rows_changed(result):
                reports.store_log_lines(
                    session, job.id, attempt, [service_line(f"ace3: {reason}; re-queued")]
                )
            session.commit()
        if rows_changed(result):
            logger.warning("job %s: %s; re-queued", job.id, reason)
            self._publish(job.id)
            return
        if cancel_asked:
            self.record(job.id, attempt, JobState.CANCELLED, exit_code=returncode)
            return
        self.record(
            job.id,
            attempt,
            JobState.FAILED,
            exit_code=returncode,
            error=f"attempt {attempt} was preempted ({why}), and the job already was "
            f"{self.settings.max_preemptions} times (ACE3_MAX_PREEMPTIONS)",
        )

    def halve_micro_batch(self, job: Job, attempt: int, stopped_for: str | None = None) -> bool:
        """Queue the next attempt with twice the micro-batch split (job.json), from the job's
        newest checkpoint; False when the micro-batch cannot be halved again (the attempt then
        fails like any other). The update itself bounds the halvings by
        :func:`max_micro_batch_halvings`, whatever a job's exit status claims. ``stopped_for``:
        the worker stopped the attempt for the job's memory limit, saying this."""
        limit = max_micro_batch_halvings(job.config, job.num_processes)
        split = 2 ** ((job.micro_batch_halvings or 0) + 1)
        what = "ran out of memory inside a training step"
        if stopped_for:
            what = f"was stopped ({stopped_for})"
        reason = (
            f"attempt {attempt} {what}; the next one runs micro-batch split {split} (the "
            "effective batch unchanged)"
        )
        with self.sessions() as session:
            result = session.execute(
                job_transitions.requeue_with_half_the_micro_batch(job.id, attempt, reason, limit)
            )
            if rows_changed(result):
                reports.store_log_lines(
                    session, job.id, attempt, [service_line(f"ace3: {reason}; retrying")]
                )
            session.commit()
        if not rows_changed(result):
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
