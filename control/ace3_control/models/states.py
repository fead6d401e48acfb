"""The states the tables store: a job's, a search's and a trial's and the job priorities are the
SDK's wire contract (:mod:`ace3.config.states`, one definition for the control plane, the API
and the client); a job node's and a webhook delivery's are the control plane's own."""

from __future__ import annotations

import enum

from ace3.config.states import (
    ACTIVE_SEARCH_STATES,
    ACTIVE_STATES,
    TERMINAL_STATES,
    JobPriority,
    JobState,
    SearchState,
    TrialState,
)

__all__ = [
    "ACTIVE_SEARCH_STATES",
    "ACTIVE_STATES",
    "TERMINAL_STATES",
    "DeliveryState",
    "JobPriority",
    "JobState",
    "NodeState",
    "SearchState",
    "TrialState",
]


class NodeState(enum.StrEnum):
    """Where one node of a multi-node attempt is (``job_nodes.state``)."""

    WAITING = "waiting"  # claimed: the worker waits for the rest of the gang
    RUNNING = "running"  # the gang is complete and this node's torchrun was launched
    EXITED = "exited"  # its torchrun ended: exit_code, error and stopped say how
    LEFT = "left"  # released without running (the gang never completed, cancel, attempt over)


class DeliveryState(enum.StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"
