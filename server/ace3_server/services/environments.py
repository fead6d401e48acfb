"""Per-job Python environments as the API shows them (docs/environments.md): the summary on a
job (``JobOut.environment``, joined from the ``environments`` row its ``environment_hash``
names) and ``GET /v1/environments/{hash}``.

Environments are shared across owners (one per set of requirements and worker installation), so
an owner may read one only when one of its own jobs used it: an owner must not learn which
packages another owner asks for, nor that an environment exists.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from ace3_control.models import Environment, Job
from ace3_server.environment_schemas import JobEnvironmentOut, PackageOut
from ace3_server.errors import not_found
from ace3_server.schemas import JobOut


async def environments_of(session: AsyncSession, jobs: Iterable[Job]) -> dict[str, Environment]:
    """The environments rows the jobs name, by hash (one query for a page of jobs)."""
    hashes = {job.environment_hash for job in jobs if job.environment_hash}
    if not hashes:
        return {}
    rows = await session.scalars(select(Environment).where(Environment.hash.in_(hashes)))
    return {row.hash: row for row in rows}


def job_environment(job: Job, environments: dict[str, Environment]) -> JobEnvironmentOut | None:
    """The job's environment summary; None until a worker resolved its requirements."""
    if not job.environment_hash:
        return None
    row = environments.get(job.environment_hash)
    packages = [
        PackageOut(name=str(item.get("name", "")), version=str(item.get("version", "")))
        for item in (row.packages or [] if row is not None else [])
    ]
    return JobEnvironmentOut(
        hash=job.environment_hash, state=row.state if row is not None else None, packages=packages
    )


async def job_out(session: AsyncSession, job: Job) -> JobOut:
    """The job's response body, its environment joined in."""
    out = JobOut.model_validate(job)
    out.environment = job_environment(job, await environments_of(session, [job]))
    return out


async def get_owned_environment(session: AsyncSession, owner_id: str, env_hash: str) -> Environment:
    """The environment ``env_hash`` names, when one of the caller's jobs used it; else 404
    (the same answer as for an unknown hash)."""
    used = await session.scalar(
        select(Job.id).where(Job.owner_id == owner_id, Job.environment_hash == env_hash).limit(1)
    )
    row = await session.get(Environment, env_hash) if used is not None else None
    if row is None:
        raise not_found("environment")
    return row
