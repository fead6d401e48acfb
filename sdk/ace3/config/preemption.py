"""Preemption settings of :class:`~ace3.config.training.TrainingConfig`: what a run does on
SIGTERM (a spot-instance notice, a worker being drained). Kept apart so that the training
schema stays readable; ``TrainingConfig`` inherits :class:`PreemptionFields`. What the engine
does with them: :mod:`ace3.runtime.loop.preemption`; what the worker does: ``ace3_worker.drain``."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

# The longest grace a job may ask for (torchrun waits this long for its ranks after a SIGTERM).
MAX_PREEMPTION_GRACE_SECONDS = 600.0


class PreemptionFields(BaseModel):
    """``checkpoint_on_sigterm``: on SIGTERM every rank finishes its optimizer step, the ranks
    agree on the step to stop at, write a checkpoint there and leave with
    ``ace3.errors.PREEMPTED_EXIT_CODE`` (an in-process run raises
    ``ace3.errors.TrainingPreemptedError``); the service re-queues the job, which resumes from
    that checkpoint. ``preemption_grace_seconds``: how long the ranks have for it before they
    are killed (the worker's ``ACE3_WORKER_DRAIN_GRACE_SECONDS`` caps it)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    checkpoint_on_sigterm: bool = Field(
        True,
        description="On SIGTERM (preemption): finish the step, agree on it across ranks, "
        "checkpoint and stop; False: SIGTERM ends the processes at once.",
    )
    preemption_grace_seconds: float | None = Field(
        None,
        gt=0.0,
        le=MAX_PREEMPTION_GRACE_SECONDS,
        allow_inf_nan=False,
        description="Seconds the ranks have after SIGTERM to finish the step and save before "
        "SIGKILL; None: the worker's ACE3_WORKER_DRAIN_GRACE_SECONDS (which also caps it).",
    )
