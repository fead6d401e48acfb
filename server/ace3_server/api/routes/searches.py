"""Hyperparameter searches: create, list, get, cancel, trials and a live event stream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable
from typing import Annotated, Any

from fastapi import Query, Request, Response
from fastapi.responses import StreamingResponse
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ace3_control.models import Search, SearchState, SearchTrial
from ace3_server.api.deps import OwnerDep, SearchDriverDep, SessionDep, SettingsDep
from ace3_server.api.params import PageCursor, StoredText
from ace3_server.api.routes.jobs import IdempotencyKey
from ace3_server.api.routing import error_responses, resource_router
from ace3_server.api.run_routes import (
    EVENT_STREAM_RESPONSES,
    create_responses,
    event_stream,
    owned_page,
    set_created_status,
)
from ace3_server.schemas import Page, SearchCreate, SearchOut, SearchTrialList, SearchTrialOut
from ace3_server.services import searches
from ace3_server.services.events import KEEPALIVE_SECONDS, format_event

router = resource_router("/searches", "searches")
NOT_FOUND = error_responses(404)

POLL_SECONDS = 0.5


@router.post(
    "",
    response_model=SearchOut,
    status_code=201,
    operation_id="create_search",
    responses=create_responses(SearchOut),
)
async def create_search(
    body: SearchCreate,
    response: Response,
    session: SessionDep,
    owner_id: OwnerDep,
    settings: SettingsDep,
    driver: SearchDriverDep,
    idempotency_key: IdempotencyKey = None,
) -> SearchOut:
    search, created = await searches.create_search(
        session,
        owner_id=owner_id,
        body=body,
        idempotency_key=idempotency_key,
        settings=settings,
    )
    driver.wake()  # (committed: its first trial starts now, not at the driver's next tick)
    set_created_status(response, created)
    return searches.search_out(search, await searches.trials_of(session, search.id))


@router.get("", response_model=Page[SearchOut], operation_id="list_searches")
async def list_searches(
    session: SessionDep,
    owner_id: OwnerDep,
    state: SearchState | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: PageCursor = None,
) -> dict[str, object]:
    rows, next_cursor = await owned_page(
        session, Search, owner_id=owner_id, state=state, cursor=cursor, limit=limit
    )
    data = [searches.search_out(row, await searches.trials_of(session, row.id)) for row in rows]
    return {"data": data, "next_cursor": next_cursor}


@router.get(
    "/{search_id}", response_model=SearchOut, operation_id="get_search", responses=NOT_FOUND
)
async def get_search(search_id: StoredText, session: SessionDep, owner_id: OwnerDep) -> SearchOut:
    search = await searches.get_owned_search(session, owner_id, search_id)
    return searches.search_out(search, await searches.trials_of(session, search.id))


@router.post(
    "/{search_id}/cancel",
    response_model=SearchOut,
    status_code=202,
    operation_id="cancel_search",
    responses=NOT_FOUND,
)
async def cancel_search(
    search_id: StoredText, session: SessionDep, owner_id: OwnerDep, driver: SearchDriverDep
) -> SearchOut:
    search = await searches.cancel_search(
        session, await searches.get_owned_search(session, owner_id, search_id)
    )
    driver.wake()  # (committed: its running trials are stopped now)
    return searches.search_out(search, await searches.trials_of(session, search.id))


@router.get(
    "/{search_id}/trials",
    response_model=SearchTrialList,
    operation_id="list_search_trials",
    responses=NOT_FOUND,
)
async def list_trials(
    search_id: StoredText, session: SessionDep, owner_id: OwnerDep
) -> dict[str, object]:
    await searches.get_owned_search(session, owner_id, search_id)
    return {"data": await searches.trials_of(session, search_id)}


def _trial_signature(trial: SearchTrial) -> tuple[Any, ...]:
    return (
        trial.state,
        trial.value,
        len(trial.intermediate_values),
        trial.epochs_run,
        trial.prune_requested,
    )


async def search_events(
    session_factory: async_sessionmaker[AsyncSession],
    search_id: str,
    is_disconnected: Callable[[], Any],
) -> AsyncGenerator[str, None]:
    """state / trial events whenever something changes, then end; the database is polled, each
    poll with a session of its own that is closed before the stream waits."""
    sent_search: dict[str, Any] | None = None
    sent_trials: dict[str, tuple[Any, ...]] = {}
    counter = 0
    last_sent = time.monotonic()
    while True:
        async with session_factory() as session:
            search = await session.get(Search, search_id)
            if search is None:
                return
            trials = await searches.trials_of(session, search_id)
            summary = searches.search_out(search, trials)
        chunks = []
        for trial in trials:
            if sent_trials.get(trial.id) != _trial_signature(trial):
                sent_trials[trial.id] = _trial_signature(trial)
                counter += 1
                trial_json = SearchTrialOut.model_validate(trial).model_dump(mode="json")
                chunks.append(format_event("trial", trial_json, str(counter)))
        state = summary.model_dump(mode="json", exclude={"updated_at"})
        if state != sent_search:
            sent_search = state
            counter += 1
            chunks.insert(0, format_event("state", summary.model_dump(mode="json"), str(counter)))
        finished = searches.is_finished(search)
        if finished:
            counter += 1
            chunks.append(format_event("end", summary.model_dump(mode="json"), str(counter)))
        if chunks:
            last_sent = time.monotonic()
            yield "".join(chunks)
        if finished or await is_disconnected():
            return
        if time.monotonic() - last_sent > KEEPALIVE_SECONDS:
            last_sent = time.monotonic()
            yield ": keep-alive\n\n"
        await asyncio.sleep(POLL_SECONDS)


@router.get(
    "/{search_id}/events",
    operation_id="stream_search_events",
    response_class=StreamingResponse,
    responses=EVENT_STREAM_RESPONSES,
)
async def stream_events(
    search_id: StoredText, request: Request, session: SessionDep, owner_id: OwnerDep
) -> StreamingResponse:
    await searches.get_owned_search(session, owner_id, search_id)
    return event_stream(
        search_events(request.app.state.session_factory, search_id, request.is_disconnected)
    )
