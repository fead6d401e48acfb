"""What a search reads of its trials' jobs: a running trial's objective per epoch and its
epochs (``read_trial``), and once the job ended, the trial's outcome (``record_outcome``)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from ace3_control.models import (
    Job,
    JobCheckpoint,
    JobMetric,
    JobState,
    SearchTrial,
    TrialState,
    utcnow,
)
from ace3_server.searches import study as studies

EPOCH_METRIC = "epoch_train_loss"  # reported once per finished epoch: counts a trial's epochs


async def _epoch_values(session: AsyncSession, job_id: str, name: str) -> dict[int, float]:
    rows = (
        await session.execute(
            select(JobMetric.epoch, JobMetric.value)
            .where(JobMetric.job_id == job_id, JobMetric.name == name, JobMetric.epoch.is_not(None))
            .order_by(JobMetric.step)
        )
    ).all()
    # the last value of each epoch (the query leaves out rows without one)
    return {int(epoch): float(value) for epoch, value in rows if epoch is not None}


async def _final_checkpoint_id(session: AsyncSession, job_id: str) -> str | None:
    return await session.scalar(
        select(JobCheckpoint.id)
        .where(JobCheckpoint.job_id == job_id)
        .order_by(JobCheckpoint.step.desc())
        .limit(1)
    )


def finish_trial(
    trial: SearchTrial, state: TrialState, *, value: float | None = None, error: str | None = None
) -> None:
    trial.state = state
    trial.value = value
    trial.error = error
    trial.finished_at = utcnow()


async def read_trial(session: AsyncSession, trial: SearchTrial, objective: str) -> Job | None:
    """Refresh a running trial's intermediate values and epochs from its job; return the job."""
    job = await session.get(Job, trial.job_id) if trial.job_id else None
    if job is None:
        return None
    values = await _epoch_values(session, job.id, objective)
    trial.intermediate_values = {str(epoch): value for epoch, value in sorted(values.items())}
    trial.epochs_run = max((await _epoch_values(session, job.id, EPOCH_METRIC)).keys(), default=0)
    return job


async def record_outcome(
    session: AsyncSession, trial: SearchTrial, job: Job, objective: str
) -> None:
    """A trial whose job ended: succeeded (with its objective), pruned, cancelled or failed."""
    values = studies.intermediate(trial)
    last = values[max(values)] if values else None
    if job.state == JobState.SUCCEEDED:
        if last is None:
            last = (job.final_metrics or {}).get(objective)
        if last is None:
            finish_trial(
                trial,
                TrialState.FAILED,
                error=f"the trial never reported the objective {objective!r}",
            )
        else:
            finish_trial(trial, TrialState.SUCCEEDED, value=float(last))
            trial.checkpoint_id = await _final_checkpoint_id(session, job.id)
    elif job.state == JobState.CANCELLED:
        finish_trial(
            trial, TrialState.PRUNED if trial.prune_requested else TrialState.CANCELLED, value=last
        )
    else:
        finish_trial(trial, TrialState.FAILED, error=(job.error or "the trial's job failed")[:4000])


def count_states(trials: Sequence[SearchTrial]) -> dict[str, int]:
    counts = dict.fromkeys([state.value for state in TrialState], 0)
    for trial in trials:
        counts[trial.state] += 1
    return counts
