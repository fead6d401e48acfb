"""Uploaded shard directories: the owner's stored shards (by sha256), their uploads (through the
API, or presigned multipart straight to an S3 store) and the dataset made of them.

``client.load_dataset(directory, format=...)`` asks which shards are missing, uploads those,
then creates the dataset; an interrupted upload resumes, as the shards stored already are not
missing any more. The upload through the API is authenticated and capped before its body is
read (``middleware.UploadGuardMiddleware``).
"""

from typing import Annotated

from fastapi import File, Form, Path, Response, UploadFile, status

from ace3_control.models import StoredDataset, StoredShard
from ace3_server.api.deps import OwnerDep, SessionDep, SettingsDep, StoreDep
from ace3_server.api.routing import error_responses, resource_router
from ace3_server.dataset_schemas import DatasetOut
from ace3_server.errors import not_found
from ace3_server.services import shard_store
from ace3_server.services.shard_datasets import create_shard_dataset
from ace3_server.shard_schemas import (
    DirectUploadAbort,
    DirectUploadComplete,
    DirectUploadOut,
    DirectUploadStart,
    ShardCheckOut,
    ShardDatasetCreate,
    ShardQuery,
    StoredShardOut,
)

router = resource_router("/datasets/shards", "datasets")

SHA256_PATTERN = "^[0-9a-f]{64}$"
STORED_BEFORE = {"model": StoredShardOut, "description": "You had stored this shard already."}


def _status(response: Response, created: bool) -> None:
    response.status_code = status.HTTP_201_CREATED if created else status.HTTP_200_OK


@router.post(
    "",
    response_model=DatasetOut,
    status_code=201,
    operation_id="create_shard_dataset",
    responses={
        200: {"model": DatasetOut, "description": "You have a dataset of these shards already."},
        **error_responses(400),
    },
)
async def create_dataset(
    body: ShardDatasetCreate,
    response: Response,
    session: SessionDep,
    owner_id: OwnerDep,
    store: StoreDep,
) -> StoredDataset:
    """A dataset (kind shards) of shards you stored, named by their paths in your directory:
    each must be stored, end in the format's ending, and (parquet) have the columns read. 201
    when new, 200 when you have a dataset of the same shards under the same names."""
    row, created = await create_shard_dataset(session, store, owner_id, body)
    _status(response, created)
    return row


@router.post(
    "/missing",
    response_model=ShardCheckOut,
    operation_id="check_dataset_shards",
    responses=error_responses(400),
)
async def missing_shards(
    body: ShardQuery,
    session: SessionDep,
    owner_id: OwnerDep,
    settings: SettingsDep,
    store: StoreDep,
) -> dict[str, object]:
    """Which of these shards (sha256s, at most 1000) you have not stored, and whether this
    server takes them straight into its object store."""
    stored = await shard_store.stored_sizes(session, owner_id, body.sha256)
    return {
        "missing": [sha256 for sha256 in dict.fromkeys(body.sha256) if sha256 not in stored],
        "direct": shard_store.direct_store(settings, store) is not None,
    }


@router.get(
    "/{sha256}",
    response_model=StoredShardOut,
    operation_id="get_dataset_shard",
    responses=error_responses(404),
)
async def get_shard(
    sha256: Annotated[str, Path(pattern=SHA256_PATTERN)], session: SessionDep, owner_id: OwnerDep
) -> StoredShard:
    row = await session.get(StoredShard, (owner_id, sha256))
    if row is None:
        raise not_found("shard")
    return row


@router.post(
    "/upload",
    response_model=StoredShardOut,
    status_code=201,
    operation_id="upload_dataset_shard",
    responses={200: STORED_BEFORE, **error_responses(400, 413)},
)
async def upload_shard(
    response: Response,
    session: SessionDep,
    owner_id: OwnerDep,
    settings: SettingsDep,
    store: StoreDep,
    file: Annotated[UploadFile, File(description="The shard's bytes.")],
    sha256: Annotated[str, Form(pattern=SHA256_PATTERN, description="The bytes' sha256.")],
) -> StoredShard:
    """One shard through the API (at most ACE3_MAX_UPLOAD_BYTES), stored when its bytes hash
    to ``sha256`` (422 naming it otherwise)."""
    row, created = await shard_store.upload_shard(session, settings, store, owner_id, file, sha256)
    _status(response, created)
    return row


@router.post(
    "/direct",
    response_model=DirectUploadOut,
    status_code=201,
    operation_id="start_direct_shard_upload",
    responses=error_responses(400, 409, 413),
)
async def start_direct_upload(
    body: DirectUploadStart, owner_id: OwnerDep, settings: SettingsDep, store: StoreDep
) -> dict[str, object]:
    """Start uploading one shard straight to the object store: presigned PUT URLs of its parts
    (each signed for its exact size). 409 when this server takes shards through the API only;
    413 past ACE3_MAX_UPLOAD_BYTES."""
    return await shard_store.start_direct_upload(settings, store, owner_id, body)


@router.post(
    "/direct/complete",
    response_model=StoredShardOut,
    status_code=201,
    operation_id="complete_direct_shard_upload",
    responses={200: STORED_BEFORE, **error_responses(400, 409)},
)
async def complete_direct_upload(
    body: DirectUploadComplete,
    response: Response,
    session: SessionDep,
    owner_id: OwnerDep,
    settings: SettingsDep,
    store: StoreDep,
) -> StoredShard:
    """Complete a direct upload: the service reads the object back, and stores it as your shard
    when its sha256 and size are the ones announced (422 naming ``sha256`` otherwise, and
    nothing is kept)."""
    row, created = await shard_store.complete_direct_upload(
        session, settings, store, owner_id, body
    )
    _status(response, created)
    return row


@router.post(
    "/direct/abort",
    status_code=204,
    operation_id="abort_direct_shard_upload",
    responses=error_responses(400, 409),
)
async def abort_direct_upload(
    body: DirectUploadAbort, owner_id: OwnerDep, settings: SettingsDep, store: StoreDep
) -> Response:
    """Abort a direct upload (its parts are freed); nothing when there is none."""
    await shard_store.abort_direct_upload(settings, store, owner_id, body)
    return Response(status_code=204)
