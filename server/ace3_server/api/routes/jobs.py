"""Jobs: create, list, get, cancel, metrics, logs, typed records, checkpoints, artifacts and the live event
stream."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import Header, Query, Request, Response
from fastapi.responses import StreamingResponse
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.concurrency import run_in_threadpool

from ace3.config.events import EVAL_SAMPLES_PAGE
from ace3_control import scheduling
from ace3_control.models import (
    TERMINAL_STATES,
    Job,
    JobCheckpoint,
    JobLog,
    JobMetric,
    JobRecord,
    JobState,
)
from ace3_server.api.deps import OwnerDep, PublisherDep, SessionDep, SettingsDep, StoreDep
from ace3_server.api.downloads import presigned_redirect, stored_file_response
from ace3_server.api.params import Int32, Int64, PageCursor, StoredText
from ace3_server.api.routing import error_responses, resource_router
from ace3_server.api.run_routes import (
    EVENT_STREAM_RESPONSES,
    create_responses,
    event_stream,
    owned_page,
    set_created_status,
)
from ace3_server.errors import field_error, not_found
from ace3_server.schemas import (
    ArtifactList,
    CheckpointList,
    JobCreate,
    JobListItem,
    JobOut,
    JobProgress,
    LogList,
    MetricList,
    Page,
    RecordList,
)
from ace3_server.services import events, job_artifacts, jobs
from ace3_server.services.environments import environments_of, job_environment, job_out
from ace3_server.services.job_progress import latest_progress

router = resource_router("/jobs", "jobs")

IdempotencyKey = Annotated[
    StoredText | None,
    Header(max_length=200, description="Retries with the same key and body return the same job."),
]
NOT_FOUND = error_responses(404)


@router.post(
    "",
    response_model=JobOut,
    status_code=201,
    operation_id="create_job",
    responses=create_responses(JobOut),
)
async def create_job(
    body: JobCreate,
    response: Response,
    session: SessionDep,
    owner_id: OwnerDep,
    publisher: PublisherDep,
    settings: SettingsDep,
    idempotency_key: IdempotencyKey = None,
) -> JobOut:
    job, created = await jobs.create_job(
        session,
        publisher,
        owner_id=owner_id,
        body=body,
        idempotency_key=idempotency_key,
        settings=settings,
    )
    set_created_status(response, created)
    return await with_queue_place(session, job)


@router.get("", response_model=Page[JobListItem], operation_id="list_jobs")
async def list_jobs(
    session: SessionDep,
    owner_id: OwnerDep,
    state: JobState | None = None,
    q: Annotated[
        StoredText | None,
        Query(max_length=200, description="Only jobs whose name contains this (any case)."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: PageCursor = None,
) -> dict[str, object]:
    rows, next_cursor = await owned_page(
        session, Job, owner_id=owner_id, state=state, cursor=cursor, limit=limit,
        where=(Job.name.icontains(q, autoescape=True),) if q else (),
    )  # fmt: skip
    progress = await latest_progress(session, rows)
    environments = await environments_of(session, rows)
    items = [JobListItem.model_validate(row) for row in rows]
    for item, row in zip(items, rows, strict=True):
        item.environment = job_environment(row, environments)
        if item.id in progress:
            item.progress = JobProgress.model_validate(progress[item.id])
    return {"data": items, "next_cursor": next_cursor}


@router.get("/{job_id}", response_model=JobOut, operation_id="get_job", responses=NOT_FOUND)
async def get_job(job_id: StoredText, session: SessionDep, owner_id: OwnerDep) -> JobOut:
    return await with_queue_place(session, await jobs.get_owned_job(session, owner_id, job_id))


async def with_queue_place(session: AsyncSession, job: Job) -> JobOut:
    """The job (its environment joined in), with its ``queue_position`` and ``waiting_reason``
    while it is queued."""
    out = await job_out(session, job)
    if job.state == JobState.QUEUED:
        position, reason = await scheduling.queue_status(session, job.id)
        out = out.model_copy(update={"queue_position": position, "waiting_reason": reason})
    return out


@router.post(
    "/{job_id}/cancel",
    response_model=JobOut,
    status_code=202,
    operation_id="cancel_job",
    responses=NOT_FOUND,
)
async def cancel_job(job_id: StoredText, session: SessionDep, owner_id: OwnerDep) -> JobOut:
    job = await jobs.get_owned_job(session, owner_id, job_id)
    return await job_out(session, await jobs.cancel_job(session, job))


@router.get(
    "/{job_id}/metrics",
    response_model=MetricList,
    operation_id="list_job_metrics",
    responses=NOT_FOUND,
)
async def list_metrics(
    job_id: StoredText,
    session: SessionDep,
    owner_id: OwnerDep,
    since_step: Annotated[Int32 | None, Query(ge=0, description="Only steps >= this.")] = None,
    name: Annotated[StoredText | None, Query(max_length=200)] = None,
) -> dict[str, object]:
    await jobs.get_owned_job(session, owner_id, job_id)
    stmt = select(JobMetric).where(JobMetric.job_id == job_id)
    if since_step is not None:
        stmt = stmt.where(JobMetric.step >= since_step)
    if name is not None:
        stmt = stmt.where(JobMetric.name == name)
    rows = (await session.scalars(stmt.order_by(JobMetric.step, JobMetric.id))).all()
    return {"data": rows}


@router.get(
    "/{job_id}/logs", response_model=LogList, operation_id="list_job_logs", responses=NOT_FOUND
)
async def list_logs(
    job_id: StoredText,
    session: SessionDep,
    owner_id: OwnerDep,
    after: Annotated[Int64, Query(ge=0, description="Only lines with seq > after.")] = 0,
    limit: Annotated[int, Query(ge=1, le=5000)] = 1000,
) -> dict[str, object]:
    await jobs.get_owned_job(session, owner_id, job_id)
    stmt = (
        select(JobLog)
        .where(JobLog.job_id == job_id, JobLog.id > after)
        .order_by(JobLog.id)
        .limit(limit)
    )
    rows = (await session.scalars(stmt)).all()
    return {"data": rows, "next_after": rows[-1].id if rows else after}


@router.get(
    "/{job_id}/records",
    response_model=RecordList,
    operation_id="list_job_records",
    responses=NOT_FOUND,
)
async def list_records(
    job_id: StoredText,
    session: SessionDep,
    owner_id: OwnerDep,
    record_type: Annotated[
        Literal["instability", "preempted", "eval_samples"] | None,
        Query(alias="type", description="Only this type."),
    ] = None,
    after: Annotated[Int64, Query(ge=0, description="Only records with id > after.")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 500,
    order: Annotated[
        Literal["oldest", "newest"],
        Query(description="oldest (default): oldest first; newest: the newest `limit` first."),
    ] = "oldest",
) -> dict[str, object]:
    """The typed records the job reported, oldest first (``order=newest``: newest first): the
    instability guard's (``instability``), preemptions (``preempted``) and the completions of
    ``eval_prompts`` at each validation (``eval_samples``). ``next_after`` is the largest id
    returned. A page that may hold eval_samples records (``type=eval_samples``, or no type)
    holds at most :data:`EVAL_SAMPLES_PAGE` (each may be 256 KiB)."""
    await jobs.get_owned_job(session, owner_id, job_id)
    stmt = select(JobRecord).where(JobRecord.job_id == job_id, JobRecord.id > after)
    if record_type is not None:
        stmt = stmt.where(JobRecord.type == record_type)
    if record_type in (None, "eval_samples"):
        limit = min(limit, EVAL_SAMPLES_PAGE)
    by_id = JobRecord.id.desc() if order == "newest" else JobRecord.id
    rows = (await session.scalars(stmt.order_by(by_id).limit(limit))).all()
    return {"data": rows, "next_after": max((row.id for row in rows), default=after)}


@router.get(
    "/{job_id}/checkpoints",
    response_model=CheckpointList,
    operation_id="list_job_checkpoints",
    responses=NOT_FOUND,
)
async def list_checkpoints(
    job_id: StoredText, session: SessionDep, owner_id: OwnerDep
) -> dict[str, object]:
    await jobs.get_owned_job(session, owner_id, job_id)
    stmt = select(JobCheckpoint).where(JobCheckpoint.job_id == job_id).order_by(JobCheckpoint.step)
    return {"data": (await session.scalars(stmt)).all()}


@router.get(
    "/{job_id}/checkpoints/{checkpoint_id}/content",
    operation_id="download_job_checkpoint",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/octet-stream": {}}}, **NOT_FOUND},
)
async def download_checkpoint(
    job_id: StoredText,
    checkpoint_id: StoredText,
    session: SessionDep,
    owner_id: OwnerDep,
    store: StoreDep,
    settings: SettingsDep,
) -> Response:
    await jobs.get_owned_job(session, owner_id, job_id)
    checkpoint = await session.get(JobCheckpoint, checkpoint_id)
    if (
        checkpoint is None
        or checkpoint.job_id != job_id
        or not await run_in_threadpool(store.exists, checkpoint.storage_key)
    ):
        raise not_found("checkpoint")
    return await stored_file_response(
        store,
        settings,
        checkpoint.storage_key,
        checkpoint.size_bytes,
        checkpoint.name,
        checkpoint.sha256,
    )


@router.get(
    "/{job_id}/artifacts",
    response_model=ArtifactList,
    operation_id="list_job_artifacts",
    responses=error_responses(400, 404),
)
async def list_artifacts(
    job_id: StoredText,
    session: SessionDep,
    owner_id: OwnerDep,
    prefix: Annotated[
        str | None,
        Query(
            max_length=1024,
            description="Only this file or directory: 'tensorboard' lists 'tensorboard/...'.",
        ),
    ] = None,
) -> dict[str, object]:
    await jobs.get_owned_job(session, owner_id, job_id)
    return {"data": await job_artifacts.list_artifacts(session, job_id, prefix)}


@router.get(
    "/{job_id}/artifacts/{path:path}",
    operation_id="download_job_artifact",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/octet-stream": {}}}, **error_responses(400, 404)},
)
async def download_artifact(
    job_id: StoredText,
    path: str,
    session: SessionDep,
    owner_id: OwnerDep,
    store: StoreDep,
    settings: SettingsDep,
) -> Response:
    job = await jobs.get_owned_job(session, owner_id, job_id)
    # A running job's artifacts change: the worker deletes a replaced version's bytes as soon
    # as the new row is committed, which could be before the client follows a presigned URL.
    # Those are streamed (open_artifact re-reads a row whose bytes vanished); an ended job's
    # artifacts no longer change, and are redirected.
    if settings.s3_presigned_downloads and job.state in TERMINAL_STATES:
        row = await job_artifacts.find_artifact(session, job_id, path)
        redirect = await presigned_redirect(
            store, settings, row.storage_key, job_artifacts.content_disposition(path), row.sha256
        )
        if redirect is not None:
            redirect.headers["x-artifact-version"] = str(row.version)
            return redirect
    artifact, handle = await job_artifacts.open_artifact(session, store, job_id, path)
    return StreamingResponse(
        job_artifacts.iter_handle(handle),
        media_type="application/octet-stream",
        headers={
            "content-length": str(artifact.size_bytes),
            "content-disposition": job_artifacts.content_disposition(path),
            "x-checksum-sha256": artifact.sha256,
            "x-artifact-version": str(artifact.version),
        },
    )


@router.get(
    "/{job_id}/events",
    operation_id="stream_job_events",
    response_class=StreamingResponse,
    responses=EVENT_STREAM_RESPONSES,
)
async def stream_events(
    job_id: StoredText,
    request: Request,
    session: SessionDep,
    owner_id: OwnerDep,
    metrics_after: Annotated[Int64, Query(ge=0)] = 0,
    logs_after: Annotated[Int64, Query(ge=0)] = 0,
    records_after: Annotated[Int64, Query(ge=0)] = 0,
    last_event_id: Annotated[str | None, Header()] = None,
) -> StreamingResponse:
    """Server-sent events: ``state``, ``metric``, ``log``, ``record`` (a typed record:
    instability, preempted) and a final ``end``. The stream holds no database connection
    while it waits (each read uses a short session of its own); on Postgres it is woken by a
    notification when the job's rows change."""
    await jobs.get_owned_job(session, owner_id, job_id)
    cursor = events.Cursor(metrics_after, logs_after, records_after)
    if last_event_id is not None:
        resumed = events.Cursor.from_event_id(last_event_id)
        if resumed is None:
            raise field_error(
                ["header", "last-event-id"],
                "expected '<metrics_after>:<logs_after>[:<records_after>]', integers from 0 to "
                "2**63-1 (the id of the last event received)",
            )
        cursor = resumed
    return event_stream(
        events.job_events(
            request.app.state.session_factory,
            job_id,
            cursor,
            request.is_disconnected,
            request.app.state.stream_wakes,
        )
    )
