"""Entry point: ``python -m ace3.runtime --job JOB_DIR/job.json`` (normally under torchrun).

Reads the job, joins the process group, builds, trains, and always tears the group down. On
failure the traceback goes to stderr and the exit status is 1; a rank that ran out of memory
inside a step of a multi-process job (:class:`ace3.errors.StepOutOfMemoryError`) exits with
``OUT_OF_MEMORY_EXIT_CODE`` (75) instead, which the worker answers with another attempt at half
the micro-batch. A rank stopped by SIGTERM after its preemption checkpoint
(:mod:`ace3.runtime.loop.preemption`) exits with ``PREEMPTED_EXIT_CODE`` (76). A rank that
fails with an exception also appends a ``rank_failure`` record (its rank, the exception, the
time in nanoseconds) to the events file, so the worker names the first failure as the cause
and a peer's failure in the collective it was waiting in as a consequence.

The process ends with ``os._exit`` after an orderly shutdown (group destroyed, atexit handlers
run, streams flushed): Gloo's worker threads outlive ``destroy_process_group`` and can release
their last tensors while the interpreter finalizes, which aborts the process (SIGABRT) now and
then; skipping finalization removes that race.
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from ace3.errors import (
    OUT_OF_MEMORY_EXIT_CODE,
    PREEMPTED_EXIT_CODE,
    StepOutOfMemoryError,
    TrainingPreemptedError,
)
from ace3.runtime.observe.log import ENGINE, TO_STDERR, keep_engine_log, set_rank
from ace3.runtime.process.log_prefix import install_log_prefix
from ace3.runtime.process.parent_death import exit_with_parent

# Checkpoint files a job keeps in its output directory (at least): the worker has stored the
# older ones long before (it reads the events file every quarter of a second).
LOCAL_CHECKPOINTS_KEPT = 3


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ace3.runtime", description=__doc__)
    parser.add_argument("--job", required=True, help="path to job.json")
    return parser.parse_args(argv)


@dataclass
class _Attempt:
    """What the entry point learns of the attempt as it starts: where its output goes (None
    until job.json was read)."""

    output_dir: Path | None = None


def _train(job_path: str, attempt: _Attempt) -> None:
    # Imported here so that a broken torch install is reported like any other failure.
    from ace3.runtime.build import build
    from ace3.runtime.job_spec import load_job_spec
    from ace3.runtime.loop.loop import RunPlace, TrainingLoop
    from ace3.runtime.loop.speed import speed_settings
    from ace3.runtime.observe.hook_factory import engine_hooks
    from ace3.runtime.observe.memory_meter import PeakMemoryMeter
    from ace3.runtime.process.distributed import init_distributed

    job = load_job_spec(job_path)
    attempt.output_dir = Path(job.output_dir)
    add_environment(job.environment)
    ctx = init_distributed(job.config)
    ENGINE.info(f"ready: world_size={ctx.world_size} backend={ctx.backend} device={ctx.device}")
    memory = PeakMemoryMeter(ctx.device)
    memory.start()
    try:
        with speed_settings(job.config, ctx.device):
            parts = build(job, ctx)
            keep_engine_log()  # (build imported the user's code, which may configure logging)
            place = RunPlace(
                label=f"job {job.job_id} attempt {job.attempt}",
                output_dir=Path(job.output_dir),
                checkpoint_dir=Path(job.output_dir) / "checkpoints",
                resumed=bool(job.resume_from),
                # The worker copies each checkpoint into the store as soon as its record is read
                # (and never deletes the job's files): the job keeps its own directory small.
                keep_checkpoints=max(job.config.max_checkpoints or 0, LOCAL_CHECKPOINTS_KEPT),
            )
            TrainingLoop(place, ctx, parts, engine_hooks(job.config, ctx), memory=memory).run()
    finally:
        memory.stop()


def add_environment(path: str | None) -> None:
    """The job's own packages (job.json's ``environment``): appended to ``sys.path`` after the
    worker's, so they add modules and never replace torch, the engine or any package the
    worker has. ``.pth`` files in it are read as in any site directory, but whatever they do to
    ``sys.path`` ends up after the worker's entries (a ``.pth`` that inserts a directory first
    is put back behind them), and torch is imported from the worker's packages before any of
    them runs. A forked rank of a warm launcher reaches this too (it runs :func:`main`), before
    the user's code is imported."""
    if not path:
        return
    import site

    import torch  # noqa: F401  (the worker's, before any .pth of the environment runs)

    worker_entries = list(sys.path)
    site.addsitedir(path)
    added = [entry for entry in sys.path if entry not in worker_entries]
    sys.path[:] = [*worker_entries, *dict.fromkeys(added)]


def main(argv: list[str] | None = None) -> int:
    """Run one job attempt in this process; return its exit status."""
    args = _parse(argv)
    if "LOCAL_RANK" in os.environ:  # under torchrun: a rank must not outlive its agent
        exit_with_parent()
    rank = int(os.environ.get("RANK", "0") or 0)
    install_log_prefix(rank)
    set_rank(rank)  # (the rank in every engine log record)
    attempt = _Attempt()
    try:
        _train(args.job, attempt)
        return 0
    except StepOutOfMemoryError as exc:
        # No traceback: the worker reads the exit status and retries with smaller micro-batches.
        keep_engine_log()
        ENGINE.error(f"StepOutOfMemoryError: {exc}", extra=TO_STDERR)
        return OUT_OF_MEMORY_EXIT_CODE
    except TrainingPreemptedError as exc:
        # No traceback: the worker re-queues the job, which resumes from this checkpoint.
        keep_engine_log()
        ENGINE.error(f"TrainingPreemptedError: {exc}", extra=TO_STDERR)
        return PREEMPTED_EXIT_CODE
    except Exception as exc:
        failed_at = time.time_ns()  # (before the group is torn down, which fails the peers)
        if attempt.output_dir is not None:
            from ace3.runtime.observe.reporting import report_rank_failure

            report_rank_failure(attempt.output_dir, rank, exc, failed_at)
        traceback.print_exc()
        return 1
    finally:
        if "ace3.runtime.process.distributed" in sys.modules:
            sys.modules["ace3.runtime.process.distributed"].destroy_distributed()
        sys.stdout.flush()
        sys.stderr.flush()


def finish() -> None:
    """What the interpreter's shutdown does that a rank needs: atexit handlers run, streams
    flushed (a warm launcher's rank calls it too: :mod:`ace3.runtime.process.warm_launcher`)."""
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                if stream is not None:
                    stream.flush()
            except (OSError, ValueError):
                pass


def _exit(code: int) -> None:
    """Finish, then leave without interpreter finalization."""
    try:
        finish()
    finally:
        os._exit(code)


if __name__ == "__main__":
    _exit(main())
