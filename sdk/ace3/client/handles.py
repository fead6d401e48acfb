"""What :meth:`Client.job` and :meth:`Client.search` hand out, as typed interfaces.

The handles themselves are the follow package's (:class:`ace3.follow.job_handle.JobHandle`,
:class:`ace3.follow.search_handle.SearchHandle`: the wait loop and the live displays). The
dependency goes one way: ``ace3.follow`` imports the client, the client never imports
``ace3.follow``. The follow package registers its handle classes here when it is imported
(``import ace3`` does); the protocols below are what the client promises of them, and the type
checker verifies at :func:`register_handles` that the classes keep the promise.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ace3.client.searches import Search, SearchTrial
from ace3.client.types import (
    Checkpoint,
    Job,
    JobEnvironment,
    JobEvent,
    JobRecord,
    LogLine,
    LogPage,
    Metric,
)
from ace3.config.events import EvalSamplesRecord, InstabilityRecord

__all__ = [
    "FinishedJob",
    "FinishedSearch",
    "JobHandleLike",
    "SearchHandleLike",
    "register_handles",
]


class FinishedJob(Protocol):
    """A succeeded job's result (:class:`ace3.TrainingResult`)."""

    job: Job
    history: dict[str, list[tuple[int, float]]]
    final_metrics: dict[str, Any]
    best_val_accuracy: float | None
    best_val_loss: float | None
    checkpoints: list[Checkpoint]
    logs_tail: list[LogLine]

    @property
    def job_id(self) -> str: ...

    def history_by_step(self) -> list[dict[str, float]]: ...


class FinishedSearch(Protocol):
    """An ended search's result (:class:`ace3.SearchResult`)."""

    search: Search
    trials: list[SearchTrial]
    best_trial: SearchTrial | None

    @property
    def best_params(self) -> dict[str, Any] | None: ...

    @property
    def best_value(self) -> float | None: ...


class _RunHandle(Protocol):
    id: str

    @property
    def state(self) -> Any: ...


class JobHandleLike(_RunHandle, Protocol):
    """A handle on a job (:class:`ace3.JobHandle`): refresh, cancel, read, wait."""

    @property
    def phase(self) -> str | None: ...

    @property
    def environment(self) -> JobEnvironment | None: ...

    @property
    def requirements(self) -> list[str] | None: ...

    def refresh(self) -> Job: ...

    def cancel(self) -> Job: ...

    def metrics(
        self, *, name: str | None = None, since_step: int | None = None
    ) -> list[Metric]: ...

    def logs(self, *, after: int | None = None, limit: int | None = None) -> LogPage: ...

    def checkpoints(self) -> list[Checkpoint]: ...

    def records(self, *, type: str | None = None) -> list[JobRecord]: ...

    def instabilities(self) -> list[InstabilityRecord]: ...

    def eval_samples(self) -> list[EvalSamplesRecord]: ...

    def best_checkpoint(self) -> Checkpoint | None: ...

    def download_checkpoint(
        self,
        checkpoint: str | Checkpoint | None = None,
        to: str | os.PathLike[str] = ".",
        *,
        verify: bool = True,
    ) -> Path: ...

    def result(self) -> FinishedJob: ...

    def wait(
        self,
        timeout: float | None = None,
        *,
        show_progress: bool | None = None,
        cancel_on_interrupt: bool = False,
        on_event: Callable[[JobEvent], None] | None = None,
    ) -> FinishedJob: ...


class SearchHandleLike(_RunHandle, Protocol):
    """A handle on a hyperparameter search (:class:`ace3.SearchHandle`)."""

    def refresh(self) -> Search: ...

    def cancel(self) -> Search: ...

    def trials(self) -> list[SearchTrial]: ...

    def result(self) -> FinishedSearch: ...

    def wait(
        self,
        timeout: float | None = None,
        *,
        show_progress: bool | None = None,
        cancel_on_interrupt: bool = False,
    ) -> FinishedSearch: ...


# (resource, client) -> handle; the client is the ``ace3.Client`` that asks (typed Any here:
# this module is below the client's own module)
JobHandleFactory = Callable[[Job, Any], JobHandleLike]
SearchHandleFactory = Callable[[Search, Any], SearchHandleLike]

_factories: dict[str, Any] = {}


def register_handles(*, job: JobHandleFactory, search: SearchHandleFactory) -> None:
    """Called by ``ace3.follow`` with its handle classes (on import)."""
    _factories["job"] = job
    _factories["search"] = search


def job_handle(job: Job, client: Any) -> JobHandleLike:
    factory: JobHandleFactory = _factory("job")
    return factory(job, client)


def search_handle(search: Search, client: Any) -> SearchHandleLike:
    factory: SearchHandleFactory = _factory("search")
    return factory(search, client)


def _factory(kind: str) -> Any:
    try:
        return _factories[kind]
    except KeyError:
        raise RuntimeError(
            f"no {kind} handle is registered: import ace3 (ace3.follow registers the handles)"
        ) from None
