"""Checkpoints across the caller's jobs: find stored checkpoints by their content hash, and
upload model weights from the caller's machine to start jobs from (and delete them).

A checkpoint file downloaded earlier is identified by its sha256, so a client can map it back
to a checkpoint id (to start a new job from it with ``resume_from_checkpoint``). Uploaded
weights (a ``.safetensors`` file, checked to hold tensors only) get an id that
``config.init_from_checkpoint_id`` accepts like a job's checkpoint id; ``DELETE`` frees them
once no unfinished job names them. A job's own checkpoints go as its ``max_checkpoints`` says.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import File, Form, Query, Response, UploadFile, status
from fastapi.responses import StreamingResponse
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from ace3_control.models import Job, JobCheckpoint, UploadedCheckpoint
from ace3_control.stored_weights import find_owned_weights
from ace3_server.api.deps import OwnerDep, SessionDep, SettingsDep, StoreDep
from ace3_server.api.downloads import stored_file_response
from ace3_server.api.params import StoredText
from ace3_server.api.routing import error_responses, resource_router
from ace3_server.errors import not_found
from ace3_server.schemas import CheckpointList, UploadedCheckpointOut
from ace3_server.services import artifacts
from ace3_server.services.uploads import stage_upload
from ace3_server.services.weights_files import prepare_weights

router = resource_router("/checkpoints", "checkpoints")


@router.get("", response_model=CheckpointList, operation_id="find_checkpoints")
async def find_checkpoints(
    session: SessionDep,
    owner_id: OwnerDep,
    sha256: Annotated[
        str,
        Query(
            pattern="^[0-9a-fA-F]{64}$",
            description="The sha256 of the checkpoint file (64 hex digits).",
        ),
    ],
) -> dict[str, object]:
    """Every stored checkpoint of the caller's jobs with these bytes, newest first."""
    stmt = (
        select(JobCheckpoint)
        .join(Job, Job.id == JobCheckpoint.job_id)
        .where(Job.owner_id == owner_id, JobCheckpoint.sha256 == sha256.lower())
        .order_by(JobCheckpoint.created_at.desc(), JobCheckpoint.id)
    )
    return {"data": (await session.scalars(stmt)).all()}


@router.post(
    "",
    response_model=UploadedCheckpointOut,
    status_code=201,
    operation_id="upload_checkpoint",
    responses={
        200: {"model": UploadedCheckpointOut, "description": "The same bytes were uploaded."},
        **error_responses(400, 413),
    },
)
async def upload_checkpoint(
    response: Response,
    session: SessionDep,
    owner_id: OwnerDep,
    settings: SettingsDep,
    store: StoreDep,
    file: Annotated[UploadFile, File(description="Model weights: a .safetensors file.")],
    name: Annotated[StoredText | None, Form(max_length=200)] = None,
) -> UploadedCheckpoint:
    """Store model weights to start jobs from (``config.init_from_checkpoint_id``)."""
    staged = await stage_upload(file.file, store.staging_dir(), settings.max_upload_bytes)
    try:
        prepared = await run_in_threadpool(
            prepare_weights, staged, owner_id=owner_id, filename=file.filename
        )
        row, created = await artifacts.store_artifact(
            session, store, UploadedCheckpoint, owner_id=owner_id, name=name, prepared=prepared
        )
    finally:
        staged.discard()
    response.status_code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
    return row


@router.get(
    "/{checkpoint_id}/content",
    operation_id="download_checkpoint",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"application/octet-stream": {}}},
        307: {"description": "Redirect to a presigned URL of the object store"},
        **error_responses(404),
    },
)
async def download_checkpoint(
    checkpoint_id: StoredText,
    session: SessionDep,
    owner_id: OwnerDep,
    store: StoreDep,
    settings: SettingsDep,
) -> Response:
    """The bytes of a checkpoint of one of the caller's jobs, or of weights they uploaded."""
    weights = await find_owned_weights(session, owner_id, checkpoint_id)
    if weights is None or not await run_in_threadpool(store.exists, weights.storage_key):
        raise not_found("checkpoint")
    return await stored_file_response(
        store, settings, weights.storage_key, weights.size_bytes, weights.name, weights.sha256
    )


@router.delete(
    "/{checkpoint_id}",
    status_code=204,
    operation_id="delete_checkpoint",
    summary="Delete Uploaded Weights",
    responses=error_responses(404, 409),
)
async def delete_uploaded_checkpoint(
    checkpoint_id: StoredText, session: SessionDep, owner_id: OwnerDep, store: StoreDep
) -> Response:
    """Delete weights you uploaded (``POST /v1/checkpoints``): their bytes leave the store and
    the id no longer starts a job (uploading the same bytes again brings it back). 409, naming
    them, while a job that has not finished starts or distils from them. A checkpoint of one of
    your jobs is not deleted here (404): a job keeps its newest ``max_checkpoints``."""
    row = await artifacts.get_owned(session, UploadedCheckpoint, owner_id, checkpoint_id)
    if row is None:
        raise not_found("uploaded weights")
    await artifacts.delete_artifact(session, store, row)
    return Response(status_code=204)
