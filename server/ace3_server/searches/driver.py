"""The search loop, owned by the service: one pass advances every active search a little.

A pass, for a search this process holds the driver lease of:
1. reads each running trial's job: its objective per epoch (the intermediate values), its epochs,
   and, once the job ended, the trial's outcome;
2. asks the pruner about running trials that reported a new epoch; a pruned trial's job is
   cancelled (the worker stops it within a heartbeat) and the trial ends ``pruned``;
3. stops the search when its trials are spent, its failure budget is spent, or it was cancelled;
4. otherwise asks Optuna for new parameters until ``parallel_trials`` run, creating each trial
   and its job in one transaction (the trial number is unique, so nothing runs twice) and
   publishing the job after the commit.

Every pass rebuilds the Optuna study from the rows (see ``study.py``). The lease (a conditional
update) lets several API processes run this loop: each search is advanced by one at a time, and
by another when that one dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from pydantic import ValidationError
from sqlalchemy import or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ace3.config import TrainingConfig, unsupported_settings
from ace3.hp import HPConfig, split_params
from ace3_control import job_transitions
from ace3_control.capacity import JobNeeds, cluster_problem
from ace3_control.db import rows_changed
from ace3_control.models import (
    ACTIVE_SEARCH_STATES,
    TERMINAL_STATES,
    Job,
    JobCheckpoint,
    JobMetric,
    JobState,
    Search,
    SearchState,
    SearchTrial,
    TrialState,
    Worker,
    utcnow,
)
from ace3_control.queue import JobPublisher
from ace3_control.settings import Settings
from ace3_control.worker_registry import live_workers
from ace3_server.searches import study as studies
from ace3_server.searches.space import grid_point, trial_params
from ace3_server.services.jobs import publish_safely
from ace3_server.services.stream_wake import StreamHub

logger = logging.getLogger(__name__)

# On SQLite (no notifications), how often the driver looks for a running trial that ended.
ENDED_POLL_SECONDS = 0.1
EPOCH_METRIC = "epoch_train_loss"  # reported once per finished epoch: counts a trial's epochs


def driver_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


# -- reading trial jobs ------------------------------------------------------------------------
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


def _finish_trial(
    trial: SearchTrial, state: TrialState, *, value: float | None = None, error: str | None = None
) -> None:
    trial.state = state
    trial.value = value
    trial.error = error
    trial.finished_at = utcnow()


async def _read_trial(session: AsyncSession, trial: SearchTrial, objective: str) -> Job | None:
    """Refresh a running trial's intermediate values and epochs from its job; return the job."""
    job = await session.get(Job, trial.job_id) if trial.job_id else None
    if job is None:
        return None
    values = await _epoch_values(session, job.id, objective)
    trial.intermediate_values = {str(epoch): value for epoch, value in sorted(values.items())}
    trial.epochs_run = max((await _epoch_values(session, job.id, EPOCH_METRIC)).keys(), default=0)
    return job


async def _record_outcome(
    session: AsyncSession, trial: SearchTrial, job: Job, objective: str
) -> None:
    """A trial whose job ended: succeeded (with its objective), pruned, cancelled or failed."""
    values = studies.intermediate(trial)
    last = values[max(values)] if values else None
    if job.state == JobState.SUCCEEDED:
        if last is None:
            last = (job.final_metrics or {}).get(objective)
        if last is None:
            _finish_trial(
                trial,
                TrialState.FAILED,
                error=f"the trial never reported the objective {objective!r}",
            )
        else:
            _finish_trial(trial, TrialState.SUCCEEDED, value=float(last))
            trial.checkpoint_id = await _final_checkpoint_id(session, job.id)
    elif job.state == JobState.CANCELLED:
        _finish_trial(
            trial, TrialState.PRUNED if trial.prune_requested else TrialState.CANCELLED, value=last
        )
    else:
        _finish_trial(
            trial, TrialState.FAILED, error=(job.error or "the trial's job failed")[:4000]
        )


# -- deciding ----------------------------------------------------------------------------------
def _counts(trials: Sequence[SearchTrial]) -> dict[str, int]:
    counts = dict.fromkeys([state.value for state in TrialState], 0)
    for trial in trials:
        counts[trial.state] += 1
    return counts


async def _prune(
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


async def _cancel_running(session: AsyncSession, trials: Sequence[SearchTrial]) -> None:
    for trial in trials:
        if trial.state == TrialState.RUNNING and trial.job_id:
            await session.execute(job_transitions.cancel_queued(trial.job_id))
            await session.execute(job_transitions.request_cancel(trial.job_id))


def _finish_search(search: Search, state: SearchState, error: str | None = None) -> None:
    search.state = state
    search.error = error
    search.finished_at = utcnow()
    search.driver_id = None
    search.driver_lease_expires_at = None


# -- creating trials ---------------------------------------------------------------------------
def _sample(
    search: Search, config: HPConfig, trials: Sequence[SearchTrial], study: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(trial params, sampler params) for the next trial number."""
    if config.algorithm == "grid":
        point = grid_point(config, len(trials))
        return point, point
    asked = study.ask(studies.distributions(config))
    return trial_params(config, asked.params), asked.params


class UnschedulableTrialError(ValueError):
    """No live worker could ever run the trial's job (its num_gpus or backend)."""


def _trial_job(
    search: Search,
    config: HPConfig,
    number: int,
    params: dict[str, Any],
    max_retries: int,
    workers: Sequence[Worker] = (),
) -> Job:
    overrides, model_kwargs = split_params(params)
    training = TrainingConfig.model_validate({**config.base_config.model_dump(), **overrides})
    problems = unsupported_settings(training)
    if problems:
        raise ValueError("; ".join(problem.reason for problem in problems))
    unschedulable = cluster_problem(JobNeeds.from_config(training), workers)
    if unschedulable is not None:
        raise UnschedulableTrialError(unschedulable.message)
    return Job(
        owner_id=search.owner_id,
        name=f"{search.name or 'search ' + search.id[:8]} trial {number}",
        model_id=search.model_id,
        dataset_id=search.dataset_id,
        validation_dataset_id=search.validation_dataset_id,
        config=training.model_dump(mode="json"),
        model_kwargs={**search.model_kwargs, **model_kwargs},
        num_processes=training.world_size,
        idempotency_key=None,
        request_hash=f"search:{search.id}:{number}",
        state=JobState.QUEUED,
        max_retries=max_retries,
    )


async def _start_trials(
    session: AsyncSession,
    search: Search,
    config: HPConfig,
    trials: list[SearchTrial],
    settings: Settings,
) -> list[str]:
    counts = _counts(trials)
    room = min(
        config.parallel_trials - counts[TrialState.RUNNING], config.trial_budget - len(trials)
    )
    if room <= 0:
        return []
    study = studies.rebuild(search.id, config, trials) if config.algorithm != "grid" else None
    workers = await live_workers(session, settings)
    job_ids = []
    for _ in range(room):
        number = len(trials)
        params, sampler_params = _sample(search, config, trials, study)
        trial = SearchTrial(
            search_id=search.id,
            number=number,
            params=params,
            sampler_params=sampler_params,
            intermediate_values={},
            system_attrs={},
            state=TrialState.RUNNING,
        )
        try:
            job = _trial_job(search, config, number, params, settings.max_retries, workers)
        except UnschedulableTrialError as exc:
            _finish_trial(trial, TrialState.FAILED, error=f"no live worker can run it: {exc}")
        except (ValidationError, ValueError) as exc:
            # Parameters this config cannot take (e.g. a batch size the processes cannot split).
            _finish_trial(trial, TrialState.FAILED, error=f"invalid parameters: {exc}"[:4000])
        else:
            session.add(job)
            await session.flush()
            trial.job_id = job.id
            job_ids.append(job.id)
        session.add(trial)
        trials.append(trial)
    return job_ids


# -- one pass ----------------------------------------------------------------------------------
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
            job := await _read_trial(session, trial, config.objective)
        ):
            jobs[trial.id] = job
    if not search.cancel_requested:
        await _prune(session, search, config, trials, jobs)
    for trial in trials:
        job = jobs.get(trial.id)
        if job is not None and job.state in TERMINAL_STATES:
            await _record_outcome(session, trial, job, config.objective)
    stopping = search.cancel_requested
    counts = _counts(trials)
    if not stopping and counts[TrialState.FAILED] >= config.failure_budget:
        search.error = (
            f"{counts[TrialState.FAILED]} trials failed (max_failed_trials={config.failure_budget})"
        )
        stopping = True
    if stopping:
        await _cancel_running(session, trials)
        if counts[TrialState.RUNNING] == 0:
            final = SearchState.CANCELLED if search.cancel_requested else SearchState.FAILED
            _finish_search(search, final, search.error)
        else:
            search.state = SearchState.CANCELLING
        return []
    job_ids = await _start_trials(session, search, config, trials, settings)
    counts = _counts(trials)
    if counts[TrialState.RUNNING] == 0 and len(trials) >= config.trial_budget:
        if counts[TrialState.SUCCEEDED]:
            _finish_search(search, SearchState.SUCCEEDED)
        else:
            _finish_search(search, SearchState.FAILED, "no trial succeeded")
    elif search.state == SearchState.QUEUED:
        search.state = SearchState.RUNNING
    return job_ids


async def _claim(
    session: AsyncSession, search_id: str, driver_id: str, lease_seconds: float
) -> bool:
    now = utcnow()
    result = await session.execute(
        update(Search)
        .where(
            Search.id == search_id,
            Search.state.in_(ACTIVE_SEARCH_STATES),
            or_(
                Search.driver_id == driver_id,
                Search.driver_lease_expires_at.is_(None),
                Search.driver_lease_expires_at < now,
            ),
        )
        .values(driver_id=driver_id, driver_lease_expires_at=now + timedelta(seconds=lease_seconds))
    )
    return bool(rows_changed(result))


async def drive_once(
    session_factory: async_sessionmaker[AsyncSession],
    publisher: JobPublisher,
    settings: Settings,
    driver_id: str,
) -> set[str]:
    """One pass over the searches this process may drive; the jobs of their running trials."""
    running: set[str] = set()
    async with session_factory() as session:
        now = utcnow()
        candidates = (
            await session.scalars(
                select(Search.id).where(
                    Search.state.in_(ACTIVE_SEARCH_STATES),
                    or_(
                        Search.driver_id == driver_id,
                        Search.driver_lease_expires_at.is_(None),
                        Search.driver_lease_expires_at < now,
                    ),
                )
            )
        ).all()
    for search_id in candidates:
        async with session_factory() as session:
            if not await _claim(session, search_id, driver_id, settings.search_lease_seconds):
                await session.rollback()
                continue
            await session.commit()
            search = await session.get(Search, search_id)
            if search is None:
                continue
            try:
                job_ids = await advance(session, search, settings)
            except Exception:
                await session.rollback()
                logger.exception("search %s: driver pass failed; retrying next pass", search_id)
                continue
            await session.commit()
            running |= set(
                await session.scalars(
                    select(SearchTrial.job_id).where(
                        SearchTrial.search_id == search_id,
                        SearchTrial.state == TrialState.RUNNING,
                        SearchTrial.job_id.is_not(None),
                    )
                )
            )
        for job_id in job_ids:
            await publish_safely(publisher, job_id)
    return running


class DriverWakes:
    """What wakes the driver before its next tick: a search created or cancelled through this
    API process (:meth:`wake`), and a running trial's job that ended, so that its outcome is
    recorded and the next trial starts at once. On Postgres the API process's LISTEN
    connection tells of ended jobs (``hub``: migration 0015's ``ace3_job_ended``); on SQLite,
    which notifies nobody, the jobs of the running trials are looked up by id every
    ENDED_POLL_SECONDS while there are any. Each ended job wakes the driver once (a search
    whose pass keeps failing, or that another process drives, never makes it spin)."""

    def __init__(
        self, session_factory: async_sessionmaker[AsyncSession], hub: StreamHub | None
    ) -> None:
        self.session_factory = session_factory
        self.hub = hub
        self._jobs: set[str] = set()  # the jobs of the running trials of the last pass
        self._reported: set[str] = set()  # those that ended and woke the driver
        self._woken = asyncio.Event()
        if hub is not None:
            hub.observe_ended(self._notified)

    @property
    def jobs(self) -> set[str]:
        return self._jobs

    @jobs.setter
    def jobs(self, job_ids: set[str]) -> None:
        self._jobs = job_ids
        self._reported &= job_ids

    def wake(self) -> None:
        self._woken.set()

    def _notified(self, job_id: str | None) -> None:
        if job_id is None:  # (the listener reconnected: it may have missed some)
            self._woken.set()
        elif job_id in self._jobs and job_id not in self._reported:
            self._reported.add(job_id)
            self._woken.set()

    async def wait(self, timeout: float) -> None:
        """Until woken, at most ``timeout`` seconds. A job that ended before the last pass
        read the running trials (so before its notification could be matched) counts too."""
        deadline = asyncio.get_running_loop().time() + timeout
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(deadline):
                while not self._woken.is_set() and not await self._newly_ended():
                    if self.hub is not None:
                        await self._woken.wait()
                    else:
                        await asyncio.sleep(ENDED_POLL_SECONDS)
        self._woken.clear()

    async def _newly_ended(self) -> bool:
        pending = self._jobs - self._reported
        if not pending:
            return False
        async with self.session_factory() as session:
            ended = set(
                await session.scalars(
                    select(Job.id).where(Job.id.in_(pending), Job.state.in_(TERMINAL_STATES))
                )
            )
        self._reported |= ended
        return bool(ended)


async def run_search_driver(
    session_factory: async_sessionmaker[AsyncSession],
    publisher: JobPublisher,
    settings: Settings,
    wakes: DriverWakes,
) -> None:
    """Advance the active searches every ``search_tick_seconds``, and at once when ``wakes``
    says (:class:`DriverWakes`)."""
    driver_id = driver_identity()
    while True:
        try:
            wakes.jobs = await drive_once(session_factory, publisher, settings, driver_id)
        except Exception:
            logger.exception("search driver pass failed; trying again")
        await wakes.wait(settings.search_tick_seconds)
