"""Jobs: creation (validated, idempotent), cancellation, and reading what a job reported."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import HTTPException
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from ace3.config import unsupported_settings
from ace3.locations import url_scheme
from ace3_control import job_transitions
from ace3_control.models import (
    Job,
    JobCheckpoint,
    JobState,
    Owner,
    StoredDataset,
    StoredModel,
)
from ace3_control.settings import Settings
from ace3_control.stored_weights import find_owned_weights
from ace3_control.worker_registry import advertised_packages, live_workers
from ace3_server.schemas import JobCreate
from ace3_server.services.admission import capacity_problems
from ace3_server.services.artifacts import get_owned
from ace3_server.services.batch_fit import batch_problems, searched
from ace3_server.services.dataset_registry import stream_problems
from ace3_server.services.hf_jobs import (
    eval_prompt_problems,
    hf_layout_problems,
    lora_target_problems,
)
from ace3_server.services.job_requirements import RequirementsCheck, check_requirements
from ace3_server.services.publishing import Publisher
from ace3_server.services.submissions import create_once, get_owned_run

logger = logging.getLogger(__name__)

REGISTER_HINT = (
    "Upload a local copy (POST /v1/datasets; the SDK's client.load_dataset(local_path)), or "
    "register the shards under an s3:// prefix the service may read (POST "
    "/v1/datasets/register; client.datasets.register(uri, format=...) or `ace3 datasets "
    "register URI --format ...`) and send the id it returns"
)
MODEL_UPLOAD_HINT = (
    "Upload the code (POST /v1/models; the SDK's client.load_model(local_path)) and send its id"
)


def _problems(body: JobCreate) -> list[dict[str, Any]]:
    problems = [
        {"loc": ["body", "config", problem.field], "msg": problem.reason, "type": "unsupported"}
        for problem in unsupported_settings(body.config)
    ]
    if body.config.init_from_checkpoint_id is not None and body.resume_from_checkpoint:
        problems.append(
            {
                "loc": ["body", "config", "init_from_checkpoint_id"],
                "msg": "init_from_checkpoint_id starts from a checkpoint's weights with a fresh "
                "optimizer at step 0, resume_from_checkpoint continues a run where it stopped: "
                "set one of them",
                "type": "value_error",
            }
        )
    return problems


def local_file_problem(loc: list[str | int], what: str, id_field: str) -> dict[str, Any]:
    """A local file path in a request: it means nothing to the service."""
    return {
        "loc": loc,
        "msg": f"{what} a local file of the SDK, never sent: upload the weights (POST "
        f"/v1/checkpoints, a .safetensors file) and send {id_field}",
        "type": "value_error",
    }


async def unowned_weights_problems(
    session: AsyncSession, owner_id: str, checkpoint_id: str | None, loc: list[str | int]
) -> list[dict[str, Any]]:
    """A weights id must name a checkpoint of one of the caller's jobs or weights the caller
    uploaded (``ace3_control.stored_weights``)."""
    if checkpoint_id is None or await find_owned_weights(session, owner_id, checkpoint_id):
        return []
    return [
        {
            "loc": loc,
            "msg": f"no checkpoint with id {checkpoint_id!r}: use the id of one of your "
            "jobs' checkpoints (GET /v1/jobs/{id}/checkpoints) or of weights you uploaded "
            "(POST /v1/checkpoints)",
            "type": "not_found",
        }
    ]


async def weights_problems(
    session: AsyncSession, owner_id: str, config: Any, loc: list[str | int]
) -> list[dict[str, Any]]:
    """``init_from_checkpoint_id`` must name a checkpoint of one of the caller's jobs or weights
    the caller uploaded; a local ``init_from`` path means nothing to the service."""
    problems: list[dict[str, Any]] = []
    if config.init_from is not None:
        problems.append(
            local_file_problem(
                [*loc, "init_from"], "init_from is", "config.init_from_checkpoint_id"
            )
        )
    return problems + await unowned_weights_problems(
        session, owner_id, config.init_from_checkpoint_id, [*loc, "init_from_checkpoint_id"]
    )


async def reference_problems(
    session: AsyncSession, owner_id: str, body: JobCreate | Any, max_artifact_bytes: int | None
) -> list[dict[str, Any]]:
    """The model and datasets a job or search names must exist and belong to the caller, and
    its config must suit the datasets (``dataset_registry.stream_problems``)."""
    problems = []
    references: list[tuple[str, Any, str | None]] = [
        ("model_id", StoredModel, body.model_id),
        ("dataset_id", StoredDataset, body.dataset_id),
        ("validation_dataset_id", StoredDataset, body.validation_dataset_id),
    ]
    datasets: dict[str, StoredDataset] = {}
    stored_model: StoredModel | None = None
    for field, model, item_id in references:
        if item_id is None:
            continue
        row = await get_owned(session, model, owner_id, item_id)
        if row is None:
            what = "model" if model is StoredModel else "dataset"
            msg = f"no {what} with id {item_id!r}"
            if url_scheme(item_id) is not None:  # s3://..., hf://...: not an id
                msg += f": it is a URL; the API takes the id of a {what} it stores. " + (
                    REGISTER_HINT if what == "dataset" else MODEL_UPLOAD_HINT
                )
            problems.append({"loc": ["body", field], "msg": msg, "type": "not_found"})
        elif model is StoredDataset:
            datasets[field] = row
        else:
            stored_model = row
    training = getattr(body.config, "base_config", body.config)  # a search's, or a job's
    loc: list[str | int] = ["body", "config"]
    if training is not body.config:
        loc.append("base_config")
    return (
        problems
        + batch_problems(stored_model, datasets, training, searched(body.config))
        + lora_target_problems(stored_model, training, loc)
        + hf_layout_problems(stored_model, training, loc, max_artifact_bytes)
        + eval_prompt_problems(stored_model, training, loc)
        + stream_problems(training, datasets, loc)
        + await weights_problems(session, owner_id, training, loc)
        + await teacher_problems(session, owner_id, training, loc)
    )


async def teacher_problems(
    session: AsyncSession, owner_id: str, config: Any, loc: list[str | int]
) -> list[dict[str, Any]]:
    """A distillation teacher (``config.distillation.teacher_model_id``) must be one of the
    caller's models, and its weights (``teacher_checkpoint_id``) a checkpoint of one of the
    caller's jobs or weights the caller uploaded (as ``init_from_checkpoint_id``)."""
    settings = getattr(config, "distillation", None)
    if settings is None:
        return []
    problems = []
    if settings.teacher_checkpoint_path is not None:
        problems.append(
            local_file_problem(
                [*loc, "distillation", "teacher_checkpoint"],
                "a local teacher_checkpoint is",
                "config.distillation.teacher_checkpoint_id",
            )
        )
    model_id = settings.teacher_model_id
    if model_id is not None and await get_owned(session, StoredModel, owner_id, model_id) is None:
        problems.append(
            {
                "loc": [*loc, "distillation", "teacher_model_id"],
                "msg": f"no model with id {model_id!r}: the teacher must be one of your stored "
                "models (client.load_model('teacher.py'))",
                "type": "not_found",
            }
        )
    return problems + await unowned_weights_problems(
        session,
        owner_id,
        settings.teacher_checkpoint_id,
        [*loc, "distillation", "teacher_checkpoint_id"],
    )


async def requirements_check(
    session: AsyncSession,
    settings: Settings,
    owner_id: str,
    model_id: str,
    config: Any,
    loc: list[str | int],
) -> RequirementsCheck:
    """``config.requirements`` merged with the model package's ``requirements.txt`` and checked
    against what the live workers have installed (``services.job_requirements``). An unknown
    model is reported by :func:`reference_problems`; its requirements count as none here."""
    model = await get_owned(session, StoredModel, owner_id, model_id)
    package = model.requirements if model is not None else None
    workers = await live_workers(session, settings) if config.requirements or package else []
    return check_requirements(config.requirements, package, loc, advertised_packages(workers))


async def resume_checkpoint_problems(
    session: AsyncSession, owner_id: str, body: JobCreate
) -> list[dict[str, Any]]:
    """``resume_from_checkpoint`` must be a stored checkpoint of one of the caller's jobs,
    written by as many processes as the new job runs (the engine resumes only with those)."""
    checkpoint_id = body.resume_from_checkpoint
    if checkpoint_id is None:
        return []
    loc = ["body", "resume_from_checkpoint"]
    row = (
        await session.execute(
            select(JobCheckpoint, Job.num_processes)
            .join(Job, Job.id == JobCheckpoint.job_id)
            .where(JobCheckpoint.id == checkpoint_id, Job.owner_id == owner_id)
        )
    ).first()
    if row is None:
        return [
            {
                "loc": loc,
                "msg": f"no checkpoint with id {checkpoint_id!r}: use the id of one of your "
                "jobs' checkpoints (GET /v1/jobs/{id}/checkpoints, or GET "
                "/v1/checkpoints?sha256=<hex> for a downloaded file)",
                "type": "not_found",
            }
        ]
    checkpoint, written_by = row
    if written_by != body.config.world_size:
        return [
            {
                "loc": loc,
                "msg": f"checkpoint {checkpoint.name} was written by {written_by} processes and "
                f"this job runs {body.config.world_size}: a checkpoint resumes only with the "
                f"process count that wrote it, so set num_gpus * num_nodes = {written_by}",
                "type": "value_error",
            }
        ]
    return []


PRIORITY_RANK = {"low": 0, "normal": 1, "high": 2}


async def quota_problems(
    session: AsyncSession,
    owner_id: str,
    processes: int,
    priority: str = "normal",
    default_max_priority: str = "normal",
) -> list[dict[str, Any]]:
    """A job larger than its owner's ``max_gpus`` could never run: refused, not queued forever
    (one that only has to wait for the owner's other jobs is queued). A priority above the
    owner's ``max_priority`` (default ``ACE3_DEFAULT_MAX_PRIORITY``) is refused: ``high`` is an
    admin's grant, or any owner could go ahead of every other one by asking."""
    limits = (
        await session.execute(
            select(Owner.max_gpus, Owner.max_priority).where(Owner.id == owner_id)
        )
    ).first()
    max_gpus = limits.max_gpus if limits is not None else None
    ceiling = (limits.max_priority if limits is not None else None) or default_max_priority
    problems: list[dict[str, Any]] = []
    if PRIORITY_RANK[priority] > PRIORITY_RANK[ceiling]:
        problems.append(
            {
                "loc": ["body", "priority"],
                "msg": f"priority {priority!r} is above what your quota allows "
                f"(max_priority={ceiling}): use {ceiling!r} or lower, or ask an admin "
                "(ace3 owners set-quota OWNER --max-priority high)",
                "type": "quota",
            }
        )
    if max_gpus is not None and processes > max_gpus:
        problems.append(
            {
                "loc": ["body", "config", "num_gpus"],
                "msg": f"the job runs {processes} processes (num_gpus x num_nodes), and your "
                f"quota is max_gpus={max_gpus}: use fewer, or ask an admin (ace3 owners "
                "set-quota)",
                "type": "quota",
            }
        )
    return problems


async def create_job(
    session: AsyncSession,
    publisher: Publisher,
    *,
    owner_id: str,
    body: JobCreate,
    idempotency_key: str | None,
    settings: Settings,
    fine_tune_request: dict[str, Any] | None = None,
) -> tuple[Job, bool]:
    """Validate, insert (queued) and publish; return (job, created). A job no live worker can
    run is refused (``services.admission``). ``fine_tune_request``: what the OpenAI-compatible
    API was asked for (``jobs.fine_tune_request``)."""
    requirements = RequirementsCheck()

    async def problems() -> list[dict[str, Any]]:
        nonlocal requirements
        requirements = await requirements_check(
            session, settings, owner_id, body.model_id, body.config, ["body", "config"]
        )
        return (
            _problems(body)
            + requirements.problems
            + await reference_problems(session, owner_id, body, settings.max_artifact_bytes)
            + await resume_checkpoint_problems(session, owner_id, body)
            + await capacity_problems(session, settings, body.config, ["body", "config"])
            + await quota_problems(
                session,
                owner_id,
                body.config.world_size,
                body.priority,
                settings.default_max_priority,
            )
        )

    def build(digest: str) -> Job:
        return Job(
            owner_id=owner_id,
            name=body.name,
            priority=body.priority,
            model_id=body.model_id,
            dataset_id=body.dataset_id,
            validation_dataset_id=body.validation_dataset_id,
            config=body.config.model_dump(mode="json"),
            model_kwargs=body.model_kwargs,
            num_processes=body.config.world_size,
            idempotency_key=idempotency_key,
            request_hash=digest,
            state=JobState.QUEUED,
            max_retries=settings.max_retries,
            resume_from_checkpoint_id=body.resume_from_checkpoint,
            requirements=requirements.merged or None,
            fine_tune_request=fine_tune_request,
        )

    try:
        job, created = await create_once(
            session, Job, owner_id=owner_id, body=body, idempotency_key=idempotency_key,
            problems=problems, build=build, extra=fine_tune_request,
        )  # fmt: skip
    except IntegrityError:
        # The checkpoint was pruned between the check above and the insert (its foreign key).
        found = await resume_checkpoint_problems(session, owner_id, body)
        if found:
            raise HTTPException(status_code=422, detail=found) from None
        raise
    if created:
        await publish_safely(publisher, job.id)
    return job, created


async def publish_safely(publisher: Publisher, job_id: str) -> None:
    """Publish after the commit, without waiting on the broker: the API's publisher
    (``services.publishing.PublishQueue``) hands the message to a thread of its own and
    returns at once. A publish that fails is logged, and the reconciler re-publishes the job
    later. (A coroutine only so that its callers need not change if it ever awaits.)"""
    try:
        publisher.publish(job_id)
    except Exception:
        logger.exception("could not publish job %s; the reconciler will re-publish it", job_id)


async def get_owned_job(session: AsyncSession, owner_id: str, job_id: str) -> Job:
    return await get_owned_run(session, Job, owner_id, job_id, "job")


async def cancel_job(session: AsyncSession, job: Job) -> Job:
    await session.execute(job_transitions.cancel_queued(job.id))
    await session.execute(job_transitions.request_cancel(job.id))
    await session.commit()
    await session.refresh(job)
    return job
