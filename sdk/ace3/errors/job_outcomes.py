"""How a training job ended badly: failed, cancelled, a non-finite loss, a step out of memory."""

from __future__ import annotations

from typing import Any

from ace3.errors.base import ACE3Error

__all__ = [
    "OUT_OF_MEMORY_EXIT_CODE",
    "PREEMPTED_EXIT_CODE",
    "InstabilityError",
    "JobCancelledError",
    "JobFailedError",
    "NonFiniteLossError",
    "StepOutOfMemoryError",
    "TrainingPreemptedError",
]


class JobFailedError(ACE3Error):
    """The training job ended in ``failed``. ``job`` is the final job; ``logs_tail`` its last
    log lines (``LogLine`` objects), also shown in the message."""

    def __init__(self, job: Any, logs_tail: list[Any] | None = None):
        self.job = job
        self.logs_tail = list(logs_tail or [])
        job_id = getattr(job, "id", "?")
        error = getattr(job, "error", None) or "no error message recorded"
        exit_code = getattr(job, "exit_code", None)
        message = f"job {job_id} failed: {error}"
        if exit_code is not None:
            message += f" (exit code {exit_code})"
        if self.logs_tail:
            message += "\nlast log lines:\n" + "\n".join(
                "  " + _format_log_line(line) for line in self.logs_tail
            )
        super().__init__(message)


class JobCancelledError(ACE3Error):
    """The training job ended in ``cancelled``. ``job`` is the final job."""

    def __init__(self, job: Any):
        self.job = job
        super().__init__(f"job {getattr(job, 'id', '?')} was cancelled")


class NonFiniteLossError(ACE3Error):
    """The training loss became NaN or infinite, and the run stopped.

    Raised by the training engine on every rank (an in-process ``Trainer.train`` raises it;
    a job fails with its message). ``step`` is the first optimizer step whose loss was not
    finite, ``reported_at_step`` the step at which the run noticed (losses are read at metric
    reports, not after every step), ``value`` ``"nan"``, ``"inf"`` or ``"-inf"``. Steps that
    the float16 loss scaler skips for inf/NaN *gradients* do not raise it.
    """

    def __init__(
        self, step: int, reported_at_step: int, value: str, metric: str = "train_loss"
    ) -> None:
        self.step = step
        self.reported_at_step = reported_at_step
        self.value = value
        self.metric = metric
        name = "training loss" if metric == "train_loss" else metric
        super().__init__(
            f"{name} became {value} at step {step} (reported at step {reported_at_step}); "
            "lower the learning rate, enable gradient clipping (max_grad_norm) or loss scaling"
        )

    # picklable: rebuilt from its fields, not from the message
    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.step, self.reported_at_step, self.value, self.metric))


class InstabilityError(ACE3Error):
    """The instability guard (``TrainingConfig.instability``) stopped the run: ``step`` is the
    optimizer step found unstable, ``reason`` what was found (``"loss nan"``, ``"loss 9.1 >
    2 x recent minimum 0.52"``, ``"grad_norm 812 > max_grad_norm_spike 100"``...) and
    ``action`` what the guard was set to do (``"stop"``, or ``"rollback"`` when it could not
    roll back). Raised on every rank; a job fails with its message."""

    def __init__(self, step: int, reason: str, action: str = "stop", note: str = "") -> None:
        self.step, self.reason, self.action, self.note = step, reason, action, note
        super().__init__(
            f"training instability at step {step}: {reason} (instability.action={action!r})"
            + (f": {note}" if note else "")
        )

    # picklable: rebuilt from its fields, not from the message
    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.step, self.reason, self.action, self.note))


# The exit status of a rank that ran out of memory inside a training step of a job with more
# than one process (EX_TEMPFAIL): the worker ends the attempt and runs the next one with half
# the micro-batch (twice the accumulation), resuming from the job's newest checkpoint.
OUT_OF_MEMORY_EXIT_CODE = 75


class StepOutOfMemoryError(ACE3Error, RuntimeError):
    """A rank ran out of memory inside a training step of a job with more than one process.

    Its peers may already wait in a collective for it (DDP's all-reduce runs during the
    backward pass), so the step cannot be retried in place: the rank leaves with
    :data:`OUT_OF_MEMORY_EXIT_CODE`, torchrun stops the others, and the worker retries the
    job with ``micro_batch_split`` doubled (the effective batch unchanged). ``micro_batch`` is
    the per-rank micro-batch that did not fit, ``split`` how many micro-batches each loader
    batch ran as.
    """

    def __init__(self, step: int, micro_batch: int, split: int) -> None:
        self.step, self.micro_batch, self.split = step, micro_batch, split
        super().__init__(
            f"out of memory at step {step} with a micro-batch of {micro_batch} sample(s) per "
            f"rank (micro-batch split {split}): this attempt ends on every rank; the next one "
            f"runs micro-batches of {-(-micro_batch // 2)} (the effective batch unchanged)"
        )

    # picklable: rebuilt from its fields, not from the message
    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.step, self.micro_batch, self.split))


# The exit status of a rank that was preempted (SIGTERM: a spot-instance notice, a worker being
# drained): it finished its step, wrote a checkpoint at the step every rank agreed on, and left.
# Distinct from OUT_OF_MEMORY_EXIT_CODE and from a failure (1).
PREEMPTED_EXIT_CODE = 76


class TrainingPreemptedError(ACE3Error):
    """The run received SIGTERM (a spot-instance notice, a worker being drained) and stopped
    after the optimizer step ``step``, on which every rank agreed; ``checkpoint`` is the
    checkpoint file written at that step (None when the run keeps no checkpoint files, e.g. an
    in-process run without ``save_dir``). Resuming from it continues the run exactly.

    A job's ranks leave with :data:`PREEMPTED_EXIT_CODE`; an in-process ``Trainer`` raises it.
    """

    def __init__(self, step: int, checkpoint: str | None) -> None:
        self.step, self.checkpoint = step, checkpoint
        where = f"checkpoint {checkpoint}" if checkpoint else "no checkpoint file (no save_dir)"
        super().__init__(f"training preempted (SIGTERM) after step {step}: {where}")

    # picklable: rebuilt from its fields, not from the message
    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.step, self.checkpoint))


def _format_log_line(line: Any) -> str:
    text = getattr(line, "line", None)
    if text is None:
        return str(line)
    rank = getattr(line, "rank", None)
    if rank is None or str(text).startswith("[rank "):
        return str(text)
    return f"[rank {rank}] {text}"
