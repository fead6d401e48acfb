"""Webhook event names, subscriptions, and the JSON body of each event."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ace3_control.models import TERMINAL_STATES, Job, JobState, Search, SearchState

PING = "ping"
"""The event ``POST /v1/webhooks/{id}/test`` sends; every webhook receives it."""

JOB_EVENTS = tuple(f"job.{state.value}" for state in JobState)
SEARCH_EVENTS = tuple(f"search.{state.value}" for state in SearchState)
WILDCARDS = ("job.*", "search.*", "*")
SUBSCRIBABLE = frozenset(JOB_EVENTS + SEARCH_EVENTS + WILDCARDS)
_SEARCH_TERMINAL = {SearchState.SUCCEEDED, SearchState.FAILED, SearchState.CANCELLED}


def subscribed(events: list[str], event_type: str) -> bool:
    """Whether a webhook subscribed to ``events`` receives ``event_type``."""
    if event_type == PING or "*" in events or event_type in events:
        return True
    kind = event_type.partition(".")[0]
    return f"{kind}.*" in events


def unknown_events(events: list[str]) -> list[str]:
    return [event for event in events if event not in SUBSCRIBABLE]


def job_data(job: Job | None, job_id: str, state: str, previous: str | None) -> dict[str, Any]:
    data: dict[str, Any] = {"id": job_id, "state": state, "previous_state": previous}
    if job is None:
        return data
    data.update(name=job.name, attempt=job.attempt)
    if state in TERMINAL_STATES and job.state == state:
        data.update(error=job.error, exit_code=job.exit_code, final_metrics=job.final_metrics)
    return data


def search_data(
    search: Search | None, search_id: str, state: str, previous: str | None
) -> dict[str, Any]:
    data: dict[str, Any] = {"id": search_id, "state": state, "previous_state": previous}
    if search is None:
        return data
    data["name"] = search.name
    if state in _SEARCH_TERMINAL and search.state == state:
        data["error"] = search.error
    return data


def body(
    delivery_id: str, event_type: str, created_at: datetime, data: dict[str, Any]
) -> dict[str, Any]:
    """``{id, type, created_at, data}``: ``id`` is the delivery's, the same on every retry."""
    return {
        "id": delivery_id,
        "type": event_type,
        "created_at": created_at.isoformat(),
        "data": data,
    }
