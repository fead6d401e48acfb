"""Hyperparameter searches over the API: the :class:`Search` and :class:`SearchTrial` objects,
and ``client.searches``, whose methods are the REST calls of ``docs/api.md`` ("Hyperparameter
searches"). A search runs its trials as ordinary jobs; :mod:`ace3.follow.search_handle` follows one
to its end.
"""

from __future__ import annotations

import builtins
import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from ace3.client._resource import _Runs
from ace3.client._sse import decode_event, follow_events
from ace3.client.types import _APIObject
from ace3.config.states import SearchState, TrialState
from ace3.hp import HPConfig

__all__ = [
    "Search",
    "SearchEvent",
    "SearchState",
    "SearchTrial",
    "Searches",
    "TrialState",
]


SEARCH_TERMINAL_STATES = frozenset(state for state in SearchState if state.is_terminal)
TRIAL_TERMINAL_STATES = frozenset(state for state in TrialState if state.is_terminal)


class SearchTrial(_APIObject):
    """One trial: the parameters it ran with, its job, and the objective it reached.

    ``value`` is the objective's last reported value; ``intermediate_values`` maps each epoch
    (as a string, as in JSON) to the objective after it. ``checkpoint_id`` is the final
    checkpoint of the trial's job.
    """

    id: str
    number: int
    state: TrialState | str = Field(union_mode="left_to_right")
    params: dict[str, Any] = Field(default_factory=dict)
    job_id: str | None = None
    value: float | None = None
    intermediate_values: dict[str, float] = Field(default_factory=dict)
    epochs_run: int = 0
    checkpoint_id: str | None = None
    error: str | None = None
    created_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def is_finished(self) -> bool:
        return self.state in TRIAL_TERMINAL_STATES

    def intermediate(self) -> list[tuple[int, float]]:
        """``[(epoch, objective), ...]`` in epoch order."""
        points = []
        for epoch, value in self.intermediate_values.items():
            with contextlib.suppress(ValueError):
                points.append((int(float(epoch)), value))
        return sorted(points)

    @property
    def latest_value(self) -> float | None:
        """The final value when there is one, else the latest intermediate value."""
        if self.value is not None:
            return self.value
        points = self.intermediate()
        return points[-1][1] if points else None


class Search(_APIObject):
    """A hyperparameter search; ``config`` is its :class:`~ace3.HPConfig` as JSON."""

    id: str
    name: str | None = None
    state: SearchState | str = Field(union_mode="left_to_right")
    model_id: str | None = None
    dataset_id: str | None = None
    validation_dataset_id: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    model_kwargs: dict[str, Any] | None = None
    cancel_requested: bool = False
    error: str | None = None
    trial_budget: int | None = None
    trials_created: int = 0
    trials_running: int = 0
    trials_succeeded: int = 0
    trials_pruned: int = 0
    trials_failed: int = 0
    epochs_run: int = 0
    best_trial: SearchTrial | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def is_terminal(self) -> bool:
        return self.state in SEARCH_TERMINAL_STATES

    @property
    def objective(self) -> str:
        return str(self.config.get("objective") or "val_accuracy")

    @property
    def direction(self) -> str:
        return str(self.config.get("direction") or "maximize")


@dataclass
class SearchEvent:
    """One event of ``GET /v1/searches/{id}/events``.

    ``type`` is ``state`` or ``end`` (``data`` a :class:`Search`) or ``trial`` (a
    :class:`SearchTrial`); an event type this SDK does not know keeps its raw decoded JSON.
    ``id`` is the search's version.
    """

    type: str
    data: Any
    id: str | None = None


def best_of(
    search: Search | None, trials: list[SearchTrial], *, with_search_best: bool = True
) -> SearchTrial | None:
    """The best succeeded trial among ``trials`` (by the search's direction, ties to the lower
    number) and, ``with_search_best``, the search's own ``best_trial`` (the search state and
    the trial events of one change can arrive in either order)."""
    candidates = {
        trial.number: trial
        for trial in trials
        if trial.state == TrialState.SUCCEEDED and trial.value is not None
    }
    if with_search_best and search is not None and search.best_trial is not None:
        candidates.setdefault(search.best_trial.number, search.best_trial)
    if not candidates:
        return None
    sign = -1.0 if search is not None and search.direction == "minimize" else 1.0
    ordered = sorted(candidates.values(), key=lambda trial: trial.number)
    return max(ordered, key=lambda trial: sign * (trial.value or 0.0))


_EVENT_MODELS: dict[str, type[BaseModel]] = {"state": Search, "end": Search, "trial": SearchTrial}


class Searches(_Runs[Search]):
    """``/v1/searches``: hyperparameter searches, their trials and live events."""

    _path = "/v1/searches"
    _run_type = Search

    def create(
        self,
        *,
        model_id: str,
        dataset_id: str,
        config: HPConfig | Mapping[str, Any],
        validation_dataset_id: str | None = None,
        model_kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
        idempotency_key: str | None = None,
    ) -> Search:
        """Start a search. With an ``idempotency_key`` the request is retried safely and a
        repeat returns the search created the first time."""
        if not isinstance(config, HPConfig):
            config = HPConfig.model_validate(dict(config))
        from ace3.client.jobs import with_uploaded_weights

        base = with_uploaded_weights(config.base_config, self._http)
        if base is not config.base_config:
            config = config.model_copy(update={"base_config": base})
        return self._create(
            model_id=model_id,
            dataset_id=dataset_id,
            config=config.model_dump(mode="json"),
            validation_dataset_id=validation_dataset_id,
            model_kwargs=model_kwargs,
            name=name,
            idempotency_key=idempotency_key,
        )

    def trials(self, search_id: str) -> builtins.list[SearchTrial]:
        """Every trial of the search, ordered by number."""
        payload = self._http.request("GET", f"/v1/searches/{search_id}/trials").json()
        trials = [SearchTrial.model_validate(item) for item in payload.get("data") or []]
        return sorted(trials, key=lambda trial: trial.number)

    def events(
        self,
        search_id: str,
        *,
        last_event_id: str | None = None,
        max_reconnects: int = 5,
        timeout: float | None = None,
    ) -> Iterator[SearchEvent]:
        """Live events of a search until its ``end`` event, reconnecting when the connection
        drops. Every (re)connection starts with the current state and every trial, so a
        trial can arrive more than once: key trials by ``number``. ``timeout`` (seconds)
        bounds the whole wait and raises ``TimeoutError``; the search keeps running."""

        for event in follow_events(
            self._http,
            f"/v1/searches/{search_id}/events",
            max_reconnects=max_reconnects,
            last_event_id=last_event_id,
            timeout=timeout,
        ):
            yield decode_event(event, _EVENT_MODELS, SearchEvent)
