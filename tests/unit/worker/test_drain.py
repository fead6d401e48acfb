"""The worker's side of preemption, without a stack: the grace a preempted attempt gets, the
drain flag a warm shutdown sets, and a preemption exit the worker did not cause (a SIGTERM from
outside to the ranks), which is retried like a killed rank (from the retry budget)."""

from __future__ import annotations

from ace3.errors import PREEMPTED_EXIT_CODE
from ace3_control.settings import Settings
from ace3_worker import drain
from ace3_worker.launcher import torchrun_command
from ace3_worker.outcome import Outcomes, drain_preemption, preempted_from_outside
from ace3_worker.sandbox.limits import JobLimits
from ace3_worker.watch import AttemptWatch


def test_the_job_s_grace_is_capped_by_the_worker_s() -> None:
    settings = Settings(worker_drain_grace_seconds=90)
    assert drain.grace_seconds({}, settings) == 90
    assert drain.grace_seconds({"preemption_grace_seconds": 20}, settings) == 20
    assert drain.grace_seconds({"preemption_grace_seconds": 300}, settings) == 90
    assert drain.grace_seconds({"preemption_grace_seconds": "x"}, settings) == 90


def test_a_warm_shutdown_sets_the_drain_flag_the_slots_read() -> None:
    assert not drain.draining()
    try:
        drain.request_drain("SIGTERM, warm shutdown")
        assert drain.draining()
    finally:
        drain.DRAIN.clear()


def test_torchrun_waits_for_ranks_that_checkpoint_after_a_sigterm() -> None:
    settings = Settings(worker_drain_grace_seconds=90, cancel_grace_seconds=10)
    assert drain.shutdown_timeout(settings) == 95
    command = torchrun_command("/j.json", 2, drain.shutdown_timeout(settings))
    assert "--shutdown-timeout=95" in command


def test_a_preemption_exit_the_worker_did_not_cause_is_a_retry_from_the_budget() -> None:
    summary = [
        "Root Cause (first observed failure):",
        "[0]:",
        "  rank      : 0 (local_rank: 0)",
        f"  exitcode  : {PREEMPTED_EXIT_CODE} (pid: 4241)",
    ]
    watch = AttemptWatch("job", 1)
    watch.output.launcher_stderr_tail.extend(summary)
    assert preempted_from_outside(watch)
    outcomes = Outcomes(Settings(), None, JobLimits.from_settings(Settings()))  # type: ignore[arg-type]
    message, retryable = outcomes.failure(watch, 1)
    assert retryable and "SIGTERM from outside the worker" in message
    watch.run.preempted_for = "the worker is draining"  # the worker's own drain: not a failure
    assert not preempted_from_outside(watch)


def test_a_rank_that_crashed_is_the_cause_even_when_its_peers_checkpointed_and_left() -> None:
    # One rank failed (exit 1); torchrun's SIGTERM made the other checkpoint and leave with the
    # preemption code: a failure of the job's code, not a preemption from outside.
    summary = [
        "Failures:",
        "[1]:",
        "  rank      : 1 (local_rank: 1)",
        f"  exitcode  : {PREEMPTED_EXIT_CODE} (pid: 4242)",
        "Root Cause (first observed failure):",
        "[0]:",
        "  rank      : 0 (local_rank: 0)",
        "  exitcode  : 1 (pid: 4241)",
    ]
    watch = AttemptWatch("job", 1)
    watch.output.launcher_stderr_tail.extend(summary)
    assert not preempted_from_outside(watch)


def test_ranks_that_left_on_the_drain_s_own_sigterm_count_as_its_preemption() -> None:
    summary = [
        "Root Cause (first observed failure):",
        "[0]:",
        "  rank      : 0 (local_rank: 0)",
        f"  exitcode  : {PREEMPTED_EXIT_CODE} (pid: 4241)",
    ]
    watch = AttemptWatch("job", 1)
    watch.output.launcher_stderr_tail.extend(summary)
    assert drain_preemption(watch) is None  # not draining: a SIGTERM from outside (a retry)
    try:
        drain.request_drain("SIGTERM, warm shutdown")
        preempted_for = drain_preemption(watch)
        assert preempted_for is not None and "draining" in preempted_for
    finally:
        drain.DRAIN.clear()
