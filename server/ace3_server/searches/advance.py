"""One step of one search (steps 1-4 of :mod:`ace3_server.searches.driver`): read its
running trials, prune, record outcomes, stop it or start its next trials."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from ace3.hp import HPConfig
from ace3_control import job_transitions
from ace3_control.models import (
    TERMINAL_STATES,
    Job,
    Search,
    SearchState,
    SearchTrial,
    TrialState,
    utcnow,
)
from ace3_control.settings import Settings
from ace3_server.searches import study as studies
from ace3_server.searches.trial_outcomes import count_states, read_trial, record_outcome
from ace3_server.searches.trial_start import start_trials

logger = logging.getLogger("ace3_server.searches.driver")  # (the driver's records, as before)


async def prune(
    session: AsyncSession,
    search: Search,
    config: HPConfig,
    trials: Sequence[SearchTrial],
    jobs: dict[str, Job],
) -> None:
    """Judge every epoch not judged yet, epoch by epoch across trials, as if it had just ended.

    Epochs can end faster than a driver pass; judging them in order keeps the pruner's view
    (successive halving's rungs) the same as if each had been judged at once. A verdict can stop
    a trial only while its job still runs.
    """
    if config.pruner == "none":
        return
    running = [
        t
        for t in trials
        if t.state == TrialState.RUNNING and len(t.intermediate_values) > t.judged_epochs
    ]
    if not running:
        return
    study = studies.rebuild(search.id, config, trials)
    pending = sorted(
        (epoch, trial.number, trial, value)
        for trial in running
        for index, (epoch, value) in enumerate(sorted(studies.intermediate(trial).items()))
        if index >= trial.judged_epochs
    )
    for epoch, _, trial, value in pending:
        if trial.prune_requested:
            continue
        verdict, trial.system_attrs = studies.judge(study, trial.number, epoch, value)
        trial.judged_epochs += 1
        job = jobs[trial.id]
        if verdict and job.state not in TERMINAL_STATES:
            trial.prune_requested = True
            await session.execute(job_transitions.cancel_queued(job.id))
            await session.execute(job_transitions.request_cancel(job.id))
            logger.info(
                "search %s: pruning trial %d after epoch %d", search.id, trial.number, epoch
            )


async def cancel_running(session: AsyncSession, trials: Sequence[SearchTrial]) -> None:
    for trial in trials:
        if trial.state == TrialState.RUNNING and trial.job_id:
            await session.execute(job_transitions.cancel_queued(trial.job_id))
            await session.execute(job_transitions.request_cancel(trial.job_id))


def finish_search(search: Search, state: SearchState, error: str | None = None) -> None:
    search.state = state
    search.error = error
    search.finished_at = utcnow()
    search.driver_id = None
    search.driver_lease_expires_at = None


async def advance(session: AsyncSession, search: Search, settings: Settings) -> list[str]:
    """Advance one search; returns the job ids to publish once the caller committed."""
    config = HPConfig.model_validate(search.config)
    trials = list(
        (
            await session.scalars(
                select(SearchTrial)
                .where(SearchTrial.search_id == search.id)
                .order_by(SearchTrial.number)
            )
        ).all()
    )
    jobs: dict[str, Job] = {}
    for trial in trials:
        if trial.state == TrialState.RUNNING and (
            job := await read_trial(session, trial, config.objective)
        ):
            jobs[trial.id] = job
    if not search.cancel_requested:
        await prune(session, search, config, trials, jobs)
    for trial in trials:
        job = jobs.get(trial.id)
        if job is not None and job.state in TERMINAL_STATES:
            await record_outcome(session, trial, job, config.objective)
    stopping = search.cancel_requested
    counts = count_states(trials)
    if not stopping and counts[TrialState.FAILED] >= config.failure_budget:
        search.error = (
            f"{counts[TrialState.FAILED]} trials failed (max_failed_trials={config.failure_budget})"
        )
        stopping = True
    if stopping:
        await cancel_running(session, trials)
        if counts[TrialState.RUNNING] == 0:
            final = SearchState.CANCELLED if search.cancel_requested else SearchState.FAILED
            finish_search(search, final, search.error)
        else:
            search.state = SearchState.CANCELLING
        return []
    job_ids = await start_trials(session, search, config, trials, settings)
    counts = count_states(trials)
    if counts[TrialState.RUNNING] == 0 and len(trials) >= config.trial_budget:
        if counts[TrialState.SUCCEEDED]:
            finish_search(search, SearchState.SUCCEEDED)
        else:
            finish_search(search, SearchState.FAILED, "no trial succeeded")
    elif search.state == SearchState.QUEUED:
        search.state = SearchState.RUNNING
    return job_ids
