"""Per-job Python environments: what one holds (docs/environments.md)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path

from ace3_control.models import Environment
from ace3_server.api.deps import OwnerDep, SessionDep
from ace3_server.api.params import StoredText
from ace3_server.api.routing import error_responses, resource_router
from ace3_server.environment_schemas import EnvironmentOut
from ace3_server.services.environments import get_owned_environment

router = resource_router("/environments", "environments")

EnvironmentHash = Annotated[
    StoredText, Path(description="The environment's hash (a job's environment.hash).")
]


@router.get(
    "/{env_hash}",
    response_model=EnvironmentOut,
    operation_id="get_environment",
    responses=error_responses(404),
)
async def get_environment(
    env_hash: EnvironmentHash, session: SessionDep, owner_id: OwnerDep
) -> Environment:
    """An environment one of your jobs used: its requirements, the packages it adds to the
    worker's Python, where it was built for, its size and build time, and why its build
    failed. Another owner's environment is a 404 like an unknown hash."""
    return await get_owned_environment(session, owner_id, env_hash)
