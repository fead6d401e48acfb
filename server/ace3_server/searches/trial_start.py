"""Starting a search's next trials: parameters from the sampler (or the grid), and each
trial's job, refused with the reason when its parameters or the live workers cannot run it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession

from ace3.config import TrainingConfig, unsupported_settings
from ace3.config.requirements import normalized_requirements
from ace3.hp import HPConfig, split_params
from ace3_control.capacity import JobNeeds, cluster_problem
from ace3_control.models import (
    Job,
    JobState,
    Search,
    SearchTrial,
    StoredModel,
    TrialState,
    Worker,
)
from ace3_control.settings import Settings
from ace3_control.worker_registry import live_workers
from ace3_server.searches import study as studies
from ace3_server.searches.space import grid_point, trial_params
from ace3_server.searches.trial_outcomes import count_states, finish_trial


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


def trial_job(
    search: Search,
    config: HPConfig,
    number: int,
    params: dict[str, Any],
    max_retries: int,
    workers: Sequence[Worker] = (),
    package_requirements: Sequence[str] = (),
) -> Job:
    """The trial's job: the base config with the trial's parameters; its requirements the
    config's merged with the model package's ``requirements.txt``, as for a job (checked when
    the search was created, so every trial shares one environment)."""
    overrides, model_kwargs = split_params(params)
    training = TrainingConfig.model_validate({**config.base_config.model_dump(), **overrides})
    problems = unsupported_settings(training)
    if problems:
        raise ValueError("; ".join(problem.reason for problem in problems))
    unschedulable = cluster_problem(JobNeeds.from_config(training), workers)
    if unschedulable is not None:
        raise UnschedulableTrialError(unschedulable.message)
    requirements = normalized_requirements(
        ("requirements.txt", package_requirements), ("config.requirements", training.requirements)
    )
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
        requirements=requirements or None,
    )


async def start_trials(
    session: AsyncSession,
    search: Search,
    config: HPConfig,
    trials: list[SearchTrial],
    settings: Settings,
) -> list[str]:
    counts = count_states(trials)
    room = min(
        config.parallel_trials - counts[TrialState.RUNNING], config.trial_budget - len(trials)
    )
    if room <= 0:
        return []
    study = studies.rebuild(search.id, config, trials) if config.algorithm != "grid" else None
    workers = await live_workers(session, settings)
    model = await session.get(StoredModel, search.model_id)
    package_requirements = (model.requirements if model is not None else None) or []
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
            job = trial_job(
                search, config, number, params, settings.max_retries, workers, package_requirements
            )
        except UnschedulableTrialError as exc:
            finish_trial(trial, TrialState.FAILED, error=f"no live worker can run it: {exc}")
        except (ValidationError, ValueError) as exc:
            # Parameters this config cannot take (e.g. a batch size the processes cannot split).
            finish_trial(trial, TrialState.FAILED, error=f"invalid parameters: {exc}"[:4000])
        else:
            session.add(job)
            await session.flush()
            trial.job_id = job.id
            job_ids.append(job.id)
        session.add(trial)
        trials.append(trial)
    return job_ids
