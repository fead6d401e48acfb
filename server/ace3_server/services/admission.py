"""Admission: refuse a job (or a search's base config) that no live worker could ever run.

``POST /v1/jobs`` and ``POST /v1/searches`` answer 422 naming ``num_gpus``, ``backend`` or
``num_nodes`` when the live workers (``worker_registry``) have room for it nowhere (a job with
``num_nodes = N`` needs N different live workers that each fit ``num_gpus``); with no worker
registered at all the job is accepted and waits (workers may start later; the embedded
``ace3 up`` starts its worker after the API), and the reconciler fails it if it is still
unschedulable after ``ACE3_UNSCHEDULABLE_AFTER_SECONDS``.

Multi-node jobs with ZeRO sharding (``zero_stage`` >= 1, or ``offload``) are refused too: every
rank writes its shard of a sharded checkpoint into the job's checkpoint directory, which is one
directory only when the nodes share a filesystem, and workers do not.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from ace3.config import TrainingConfig
from ace3_control.capacity import JobNeeds, cluster_problem
from ace3_control.settings import Settings
from ace3_control.worker_registry import live_workers


async def capacity_problems(
    session: AsyncSession,
    settings: Settings,
    config: TrainingConfig,
    loc: list[str | int],
    *,
    searched: Collection[str] = (),
) -> list[dict[str, Any]]:
    """One 422 entry at ``loc + [field]`` when no live worker can run ``config``; fields in
    ``searched`` (a search varies them per trial, and checks each trial) are not refused."""
    problems: list[dict[str, Any]] = []
    problem = cluster_problem(JobNeeds.from_config(config), await live_workers(session, settings))
    if problem is None or problem.field in searched:
        return problems
    return [
        *problems,
        {"loc": [*loc, problem.field], "msg": problem.message, "type": "unschedulable"},
    ]
