"""What a hyperparameter search gives back: :class:`SearchResult` for a finished search,
:class:`BestParams` (what :func:`ace3.hyperparameter_search` returns), and
:class:`SearchHandle` to follow, wait on or cancel a search that is still running."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ace3.client.searches import Search, SearchEvent, SearchState, SearchTrial, best_of
from ace3.client.types import Checkpoint
from ace3.config import TrainingConfig
from ace3.errors import ACE3Error, SearchCancelledError, SearchFailedError
from ace3.follow.display import display_mode
from ace3.follow.waiting import FollowedHandle
from ace3.hp import split_params

if TYPE_CHECKING:
    from ace3.client import Client

__all__ = ["BestParams", "SearchHandle", "SearchResult"]


@dataclass(repr=False)
class SearchResult:
    """A finished search and every trial it ran.

    ``best_trial`` is the best succeeded trial (None when none succeeded), ``best_params``
    its parameters as a dict (the search space's keys, ``model.<name>`` included),
    ``best_checkpoint`` the final checkpoint of its job. ``epochs_run`` is what the search
    cost: the epochs every trial trained.
    """

    search: Search
    trials: list[SearchTrial] = field(default_factory=list)
    best_trial: SearchTrial | None = None
    best_checkpoint: Checkpoint | None = None
    client: Client | None = field(default=None, compare=False)

    @classmethod
    def from_search(
        cls, search: Search, trials: list[SearchTrial], client: Client | None = None
    ) -> SearchResult:
        """The result of ``search``; fetches the best trial's checkpoint when ``client`` is
        given."""
        ordered = sorted(trials, key=lambda trial: trial.number)
        best = _best_trial(search, ordered)
        checkpoint = None
        if client is not None and best is not None and best.job_id and best.checkpoint_id:
            checkpoint = next(
                (
                    item
                    for item in client.jobs.checkpoints(best.job_id)
                    if item.id == best.checkpoint_id
                ),
                None,
            )
        return cls(search, ordered, best, checkpoint, client)

    def __repr__(self) -> str:
        return (
            f"SearchResult(search_id={self.search_id!r}, state={str(self.search.state)!r}, "
            f"trials={len(self.trials)}, best_value={self.best_value!r}, "
            f"best_params={self.best_params!r})"
        )

    @property
    def search_id(self) -> str:
        return self.search.id

    @property
    def objective(self) -> str:
        return self.search.objective

    @property
    def direction(self) -> str:
        return self.search.direction

    @property
    def best_params(self) -> dict[str, Any] | None:
        return dict(self.best_trial.params) if self.best_trial is not None else None

    @property
    def best_value(self) -> float | None:
        return self.best_trial.value if self.best_trial is not None else None

    @property
    def best_job_id(self) -> str | None:
        return self.best_trial.job_id if self.best_trial is not None else None

    @property
    def epochs_run(self) -> int:
        return self.search.epochs_run

    @property
    def best_model_kwargs(self) -> dict[str, Any] | None:
        """The best trial's model factory arguments: the search's ``model_kwargs`` with the
        searched ``model.<name>`` values applied."""
        if self.best_trial is None:
            return None
        _, searched = split_params(self.best_trial.params)
        return {**(self.search.model_kwargs or {}), **searched}

    def best_config(self) -> TrainingConfig | None:
        """The TrainingConfig the best trial ran with: the search's ``base_config`` with the
        searched fields applied (to train the final model with)."""
        if self.best_trial is None:
            return None
        overrides, _ = split_params(self.best_trial.params)
        base = dict(self.search.config.get("base_config") or {})
        return TrainingConfig.model_validate({**base, **overrides})

    def download_best_checkpoint(
        self, to: str | os.PathLike[str] = ".", *, verify: bool = True
    ) -> Path:
        """Download the best trial's final checkpoint to ``to`` (a file path, or an existing
        directory to put it in under its own name)."""
        best = self.best_trial
        if best is None:
            raise ValueError(f"search {self.search_id} has no succeeded trial: no checkpoint")
        if not best.job_id or not best.checkpoint_id:
            raise ValueError(
                f"the best trial ({best.number}) of search {self.search_id} has no checkpoint"
            )
        if self.client is None:
            raise ValueError("this SearchResult has no client to download with")
        checkpoint = self.best_checkpoint or best.checkpoint_id
        return self.client.jobs.download_checkpoint(best.job_id, checkpoint, to, verify=verify)


def _best_trial(search: Search, trials: list[SearchTrial]) -> SearchTrial | None:
    """The search's own best trial (its fresh copy from ``trials``), else the best succeeded
    trial by the search's direction."""
    if search.best_trial is not None:
        by_number = {trial.number: trial for trial in trials}
        return by_number.get(search.best_trial.number, search.best_trial)
    return best_of(search, trials)


class BestParams(dict):
    """The best parameters of a search, as a plain dict (``print`` shows the dict), with
    ``result`` (the :class:`SearchResult`: every trial, the best value and checkpoint) and
    ``search_id``. Empty when no trial succeeded."""

    def __init__(self, params: dict[str, Any] | None, result: SearchResult):
        super().__init__(params or {})
        self.result = result

    @property
    def search_id(self) -> str:
        return self.result.search_id

    @property
    def value(self) -> float | None:
        """The objective the best trial reached."""
        return self.result.best_value


class SearchHandle(FollowedHandle[Search, SearchEvent]):
    """A submitted search: follow it, wait for it, cancel it, read its trials."""

    kind = "search"
    resource_type = Search
    wait_again = "client.search({id!r}).wait()"
    stops_after_cancel = "Its running trials stop on the server shortly."

    @property
    def search(self) -> Search | None:
        """The search as last seen (None until it was read)."""
        return self._last

    @search.setter
    def search(self, search: Search | None) -> None:
        self._last = search

    def _collection(self) -> Any:
        return self._client.searches

    def cancel(self) -> Search:
        """Stop the search; returns at once (running trials are cancelled, the search goes
        through ``cancelling`` and ends ``cancelled`` keeping its best trial so far)."""
        return super().cancel()

    def trials(self) -> list[SearchTrial]:
        return self._client.searches.trials(self.id)

    def result(self) -> SearchResult:
        """The result of a search that already ended (see :meth:`wait` for a running one)."""
        return self._outcome(self.refresh(), {})

    def wait(
        self,
        timeout: float | None = None,
        *,
        show_progress: bool | None = None,
        cancel_on_interrupt: bool = False,
    ) -> SearchResult:
        """Follow the search until it ends; return its :class:`SearchResult`.

        Raises :class:`~ace3.errors.SearchFailedError` or
        :class:`~ace3.errors.SearchCancelledError`, and ``TimeoutError`` after ``timeout``
        seconds (the search keeps running). ``show_progress``: None shows nothing, True a
        live table of the trials (plain lines when stdout is not a terminal), False plain
        lines. With ``cancel_on_interrupt``, Ctrl-C cancels the search before re-raising.
        """
        from ace3.follow.search_display import create_search_display

        streamed: dict[int, SearchTrial] = {}

        def observe(event: SearchEvent) -> None:
            if isinstance(event.data, SearchTrial):
                streamed[event.data.number] = event.data

        display = create_search_display(self.search, mode=display_mode(show_progress))
        final = self._follow(
            display, timeout=timeout, cancel_on_interrupt=cancel_on_interrupt, on_event=observe
        )
        return self._outcome(final, streamed)

    def _outcome(self, search: Search, streamed: dict[int, SearchTrial]) -> SearchResult:
        self.search = search
        if not search.is_terminal:
            raise RuntimeError(f"search {search.id} has not finished: it is {search.state}")
        trials = dict(streamed)
        try:
            trials.update((trial.number, trial) for trial in self.trials())
        except ACE3Error:
            if search.state == SearchState.SUCCEEDED:
                raise  # a result must hold every trial
            # a failed or cancelled search is reported with the trials the stream gave
        ordered = [trials[number] for number in sorted(trials)]
        if search.state == SearchState.FAILED:
            raise SearchFailedError(search, ordered)
        if search.state == SearchState.CANCELLED:
            raise SearchCancelledError(search, ordered)
        return SearchResult.from_search(search, ordered, self._client)
