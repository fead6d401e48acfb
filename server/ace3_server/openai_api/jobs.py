"""``/openai/v1/fine_tuning/jobs``: a fine-tuning job is an ordinary ACE3 job (the same id),
created through the same submission service as ``POST /v1/jobs`` (its checks, quotas,
priorities and Idempotency-Key), with what OpenAI's request asked for kept in
``jobs.fine_tune_request``. Retrieve, cancel and the checkpoints work on any job of the caller;
the list shows the jobs made here."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Query
from sqlalchemy import and_, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from ace3_control.models import TERMINAL_STATES, Job, JobCheckpoint, StoredDataset, StoredModel
from ace3_server.api.deps import OwnerDep, PublisherDep, SessionDep, SettingsDep
from ace3_server.api.params import StoredText
from ace3_server.openai_api.errors import OpenAIError, OpenAIRoute
from ace3_server.openai_api.events import list_job_events
from ace3_server.openai_api.mapping import (
    FineTuningJobCreate,
    requested_hyperparameters,
    status_of,
    training_config,
)
from ace3_server.openai_api.objects import checkpoint_object, job_object
from ace3_server.openai_api.owned import owned_job
from ace3_server.schemas import JobCreate
from ace3_server.services import artifacts, jobs
from ace3_server.services.hf_models import HUGGINGFACE
from ace3_server.services.pagination import paginate

router = APIRouter(prefix="/fine_tuning/jobs", route_class=OpenAIRoute, include_in_schema=False)
router.add_api_route("/{job_id}/events", list_job_events, methods=["GET"])
Limit = Annotated[int, Query(ge=1, le=100)]


async def find_model(session: AsyncSession, owner_id: str, model: str) -> StoredModel:
    """The caller's model with this id, else the newest of the caller's models of this name;
    404 when none; 400 when it is not a Hugging Face model directory."""
    row = await artifacts.get_owned(session, StoredModel, owner_id, model)
    if row is None:
        row = await session.scalar(
            select(StoredModel)
            .where(
                StoredModel.owner_id == owner_id,
                StoredModel.name == model,
                StoredModel.deleted_at.is_(None),
            )
            .order_by(StoredModel.created_at.desc(), StoredModel.id.desc())
            .limit(1)
        )
    if row is None:
        raise OpenAIError(
            404,
            f"no model {model!r}: use the id or name of one of your models (client.load_model"
            "('model-dir') uploads a Hugging Face model directory)",
            param="model",
            code="model_not_found",
        )
    if row.kind != HUGGINGFACE:
        raise OpenAIError(
            400,
            f"model {model!r} is not a Hugging Face model directory: this API fine-tunes "
            "those (upload one with client.load_model('model-dir'))",
            param="model",
        )
    return row


async def find_file(session: AsyncSession, owner_id: str, file_id: str, param: str) -> str:
    if await artifacts.get_owned(session, StoredDataset, owner_id, file_id) is None:
        raise OpenAIError(404, f"no file with id {file_id!r}", param=param, code="file_not_found")
    return file_id


@router.post("")
async def create_fine_tuning_job(
    body: FineTuningJobCreate,
    session: SessionDep,
    owner_id: OwnerDep,
    publisher: PublisherDep,
    settings: SettingsDep,
    idempotency_key: Annotated[StoredText | None, Header(max_length=200)] = None,
) -> dict[str, Any]:
    config = training_config(body)
    model = await find_model(session, owner_id, body.model)
    training = await find_file(session, owner_id, body.training_file, "training_file")
    validation = body.validation_file
    if validation is not None:
        validation = await find_file(session, owner_id, validation, "validation_file")
    request = {
        "model": body.model,
        "suffix": body.suffix,
        "metadata": body.metadata,
        "hyperparameters": requested_hyperparameters(body),
        "ace3": body.ace3,
    }
    job_body = JobCreate(
        model_id=model.id,
        dataset_id=training,
        validation_dataset_id=validation,
        config=config,
        name=f"fine-tune:{body.suffix}" if body.suffix else "fine-tune",
    )
    job, _ = await jobs.create_job(
        session, publisher, owner_id=owner_id, body=job_body, idempotency_key=idempotency_key,
        settings=settings, fine_tune_request=request,
    )  # fmt: skip
    return job_object(job)


@router.get("")
async def list_fine_tuning_jobs(
    session: SessionDep,
    owner_id: OwnerDep,
    after: Annotated[StoredText | None, Query(max_length=64)] = None,
    limit: Limit = 20,
) -> dict[str, Any]:
    """The caller's jobs made through this API, newest first."""
    stmt = select(Job).where(Job.owner_id == owner_id, Job.fine_tune_request.is_not(None))
    try:
        rows, next_cursor = await paginate(
            session, stmt, Job, owner_id=owner_id, cursor=after, limit=limit
        )
    except HTTPException as exc:  # the unknown cursor, named as OpenAI names it
        if exc.status_code != 422:
            raise
        raise OpenAIError(400, f"no job {after!r} to list after", param="after") from None
    data = [job_object(row) for row in rows]
    return {"object": "list", "data": data, "has_more": next_cursor is not None}


@router.get("/{job_id}")
async def retrieve_fine_tuning_job(
    job_id: StoredText, session: SessionDep, owner_id: OwnerDep
) -> dict[str, Any]:
    return job_object(await owned_job(session, owner_id, job_id))


@router.post("/{job_id}/cancel")
async def cancel_fine_tuning_job(
    job_id: StoredText, session: SessionDep, owner_id: OwnerDep
) -> dict[str, Any]:
    job = await owned_job(session, owner_id, job_id)
    if job.state in TERMINAL_STATES:
        raise OpenAIError(
            400,
            f"the job is {status_of(job.state)} already: only a job that has not finished can "
            "be cancelled",
            param="fine_tuning_job_id",
            code="invalid_state",
        )
    return job_object(await jobs.cancel_job(session, job))


@router.get("/{job_id}/checkpoints")
async def list_fine_tuning_checkpoints(
    job_id: StoredText,
    session: SessionDep,
    owner_id: OwnerDep,
    after: Annotated[StoredText | None, Query(max_length=64)] = None,
    limit: Limit = 10,
) -> dict[str, Any]:
    """The job's stored checkpoints, newest (highest step) first."""
    await owned_job(session, owner_id, job_id)
    stmt = select(JobCheckpoint).where(JobCheckpoint.job_id == job_id)
    if after is not None:
        anchor = await session.get(JobCheckpoint, after)
        if anchor is None or anchor.job_id != job_id:
            raise OpenAIError(400, f"no checkpoint {after!r} of this job", param="after")
        stmt = stmt.where(
            or_(
                JobCheckpoint.step < anchor.step,
                and_(JobCheckpoint.step == anchor.step, JobCheckpoint.id < anchor.id),
            )
        )
    order = (JobCheckpoint.step.desc(), JobCheckpoint.id.desc())
    rows = list((await session.scalars(stmt.order_by(*order).limit(limit + 1))).all())
    data = [checkpoint_object(row) for row in rows[:limit]]
    return {"object": "list", "data": data, "has_more": len(rows) > limit}
