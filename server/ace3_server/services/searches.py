"""Hyperparameter searches: creation (validated, idempotent), cancellation, and their summary."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from ace3.config.search_checks import search_space_problems
from ace3.hp import HPConfig
from ace3_control.models import Search, SearchState, SearchTrial, TrialState, utcnow
from ace3_control.settings import Settings
from ace3_server.schemas import SearchCreate, SearchOut, SearchTrialOut
from ace3_server.services.admission import capacity_problems
from ace3_server.services.jobs import reference_problems, requirements_check
from ace3_server.services.submissions import create_once, get_owned_run

MAX_GRID_SIZE = 10_000
_TERMINAL_SEARCH_STATES = frozenset(
    {SearchState.SUCCEEDED, SearchState.FAILED, SearchState.CANCELLED}
)


def _config_problems(config: HPConfig) -> list[dict[str, Any]]:
    """422 entries for everything the SDK would refuse too (ace3.config.search_checks), plus grid size."""
    unsupported, invalid = search_space_problems(config)
    problems = []
    for problem in unsupported:
        section, _, field = problem.field.rpartition(".")
        problems.append(
            {
                "loc": ["body", "config", section or "base_config", field],
                "msg": problem.reason,
                "type": "unsupported",
            }
        )
    for message in invalid:
        key = message.split(":", 1)[0]
        problems.append(
            {"loc": ["body", "config", "search_space", key], "msg": message, "type": "value_error"}
        )
    if config.algorithm == "grid" and config.grid_size > MAX_GRID_SIZE:
        problems.append(
            {
                "loc": ["body", "config", "search_space"],
                "msg": f"the grid has {config.grid_size} combinations; at most {MAX_GRID_SIZE} are allowed",
                "type": "value_error",
            }
        )
    return problems


async def create_search(
    session: AsyncSession,
    *,
    owner_id: str,
    body: SearchCreate,
    idempotency_key: str | None,
    settings: Settings,
) -> tuple[Search, bool]:
    """Validate and insert (queued): the driver loop picks it up. Returns (search, created).
    A base config no live worker can run is refused, unless the field at fault is searched (the
    driver then checks every trial)."""

    async def problems() -> list[dict[str, Any]]:
        # The trials' requirements: the base config's, merged with the model's (trial_start).
        requirements = await requirements_check(
            session,
            settings,
            owner_id,
            body.model_id,
            body.config.base_config,
            ["body", "config", "base_config"],
        )
        return (
            _config_problems(body.config)
            + requirements.problems
            + await reference_problems(session, owner_id, body, settings.max_artifact_bytes)
            + await capacity_problems(
                session,
                settings,
                body.config.base_config,
                ["body", "config", "base_config"],
                searched=body.config.search_space.keys(),
            )
        )

    def build(digest: str) -> Search:
        return Search(
            owner_id=owner_id,
            name=body.name,
            model_id=body.model_id,
            dataset_id=body.dataset_id,
            validation_dataset_id=body.validation_dataset_id,
            config=body.config.model_dump(mode="json"),
            model_kwargs=body.model_kwargs,
            idempotency_key=idempotency_key,
            request_hash=digest,
            state=SearchState.QUEUED,
        )

    return await create_once(
        session, Search, owner_id=owner_id, body=body, idempotency_key=idempotency_key,
        problems=problems, build=build,
    )  # fmt: skip


async def get_owned_search(session: AsyncSession, owner_id: str, search_id: str) -> Search:
    return await get_owned_run(session, Search, owner_id, search_id, "search")


async def trials_of(session: AsyncSession, search_id: str) -> list[SearchTrial]:
    stmt = (
        select(SearchTrial).where(SearchTrial.search_id == search_id).order_by(SearchTrial.number)
    )
    return list((await session.scalars(stmt)).all())


async def cancel_search(session: AsyncSession, search: Search) -> Search:
    """Raise the flag; the driver stops the running trials and ends the search."""
    if search.state not in _TERMINAL_SEARCH_STATES:
        search.cancel_requested = True
        search.state = SearchState.CANCELLING
        search.updated_at = utcnow()
        await session.commit()
    return search


def best_trial(config: HPConfig, trials: Sequence[SearchTrial]) -> SearchTrial | None:
    finished = [t for t in trials if t.state == TrialState.SUCCEEDED and t.value is not None]
    if not finished:
        return None
    pick = max if config.direction == "maximize" else min
    return pick(
        finished,
        key=lambda t: (
            (t.value, -t.number) if config.direction == "maximize" else (t.value, t.number)
        ),
    )


def search_out(search: Search, trials: Sequence[SearchTrial]) -> SearchOut:
    config = HPConfig.model_validate(search.config)
    counts = {state: sum(1 for t in trials if t.state == state) for state in TrialState}
    best = best_trial(config, trials)
    return SearchOut(
        id=search.id,
        name=search.name,
        state=search.state,
        model_id=search.model_id,
        dataset_id=search.dataset_id,
        validation_dataset_id=search.validation_dataset_id,
        config=search.config,
        model_kwargs=search.model_kwargs,
        cancel_requested=search.cancel_requested,
        error=search.error,
        trial_budget=config.trial_budget,
        trials_created=len(trials),
        trials_running=counts[TrialState.RUNNING],
        trials_succeeded=counts[TrialState.SUCCEEDED],
        trials_pruned=counts[TrialState.PRUNED],
        trials_failed=counts[TrialState.FAILED],
        epochs_run=sum(t.epochs_run for t in trials),
        best_trial=SearchTrialOut.model_validate(best) if best is not None else None,
        created_at=search.created_at,
        updated_at=search.updated_at,
        finished_at=search.finished_at,
    )


def is_finished(search: Search) -> bool:
    return search.state in _TERMINAL_SEARCH_STATES
