"""The states and priorities that travel between the control plane, the API and the SDK,
defined once: ``ace3_control.models`` stores them, the API's schemas name them and the client
parses them (``ace3.JobState``, ``ace3.SearchState``, ``ace3.TrialState``). Torch-free."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

__all__ = [
    "ACTIVE_SEARCH_STATES",
    "ACTIVE_STATES",
    "TERMINAL_STATES",
    "JobPriority",
    "JobState",
    "Priority",
    "RunState",
    "SearchState",
    "TrialState",
    "WaitingReason",
]

_FINAL_STATES = frozenset({"succeeded", "failed", "cancelled", "pruned"})


class RunState(StrEnum):
    """The state of a job, a search or a trial: ``succeeded``, ``failed``, ``cancelled`` (and a
    trial's ``pruned``) are final."""

    @property
    def is_terminal(self) -> bool:
        return self.value in _FINAL_STATES


class JobState(RunState):
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    CANCELLING = "cancelling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


#: A job's final states, and the states of a job that holds a worker slot.
TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
ACTIVE_STATES = frozenset({JobState.STARTING, JobState.RUNNING, JobState.CANCELLING})


class SearchState(RunState):
    QUEUED = "queued"
    RUNNING = "running"
    CANCELLING = "cancelling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


ACTIVE_SEARCH_STATES = frozenset({SearchState.QUEUED, SearchState.RUNNING, SearchState.CANCELLING})


class TrialState(RunState):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    PRUNED = "pruned"
    FAILED = "failed"
    CANCELLED = "cancelled"


class JobPriority(StrEnum):
    """The order in which queued jobs are claimed (``ace3_control.scheduling``)."""

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


#: :class:`JobPriority`'s values, as the API's schemas declare them.
Priority = Literal["high", "normal", "low"]
#: Why a queued job waits (``GET /v1/jobs/{id}``, ``GET /v1/queue``).
WaitingReason = Literal["quota", "capacity", "priority"]
