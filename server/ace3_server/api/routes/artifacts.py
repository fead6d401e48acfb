"""Models and datasets: upload, list, get, delete (two routers over one service).

Uploads are authenticated before their body is read (``middleware.UploadGuardMiddleware``).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import File, Form, Query, Response, UploadFile, status
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from ace3_control.models import StoredDataset, StoredModel
from ace3_server.api.deps import OwnerDep, SessionDep, SettingsDep, StoreDep
from ace3_server.api.params import PageCursor, StoredText
from ace3_server.api.routing import error_responses, resource_router
from ace3_server.errors import not_found
from ace3_server.schemas import DatasetOut, ModelOut, Page
from ace3_server.services import artifacts
from ace3_server.services.pagination import paginate
from ace3_server.services.uploads import stage_upload

models_router = resource_router("/models", "models")
datasets_router = resource_router("/datasets", "datasets")

Limit = Annotated[int, Query(ge=1, le=200)]
Sha256 = Annotated[
    str | None, Query(pattern="^[0-9a-f]{64}$", description="Filter by content hash.")
]
Name = Annotated[StoredText | None, Form(max_length=200)]
UPLOAD_RESPONSES = error_responses(400, 413)
NOT_FOUND = error_responses(404)
IN_USE = error_responses(404, 409)


@models_router.post(
    "",
    response_model=ModelOut,
    status_code=201,
    operation_id="upload_model",
    responses={
        200: {"model": ModelOut, "description": "The same bytes were already uploaded."},
        **UPLOAD_RESPONSES,
    },
)
async def upload_model(
    response: Response,
    session: SessionDep,
    owner_id: OwnerDep,
    settings: SettingsDep,
    store: StoreDep,
    file: Annotated[UploadFile, File(description="A .py file, or an archive of a package.")],
    name: Name = None,
    factory: Annotated[StoredText, Form(max_length=200)] = "build_model",
    entry_module: Annotated[StoredText | None, Form(max_length=200)] = None,
) -> StoredModel:
    staged = await stage_upload(file.file, store.staging_dir(), settings.max_upload_bytes)
    try:
        prepared = await run_in_threadpool(
            artifacts.prepare_model,
            staged,
            owner_id=owner_id,
            filename=file.filename,
            factory=factory,
            entry_module=entry_module,
            staging_dir=store.staging_dir(),
            max_extracted_bytes=settings.max_extracted_bytes,
            max_archive_members=settings.max_archive_members,
        )
        row, created = await artifacts.store_artifact(
            session, store, StoredModel, owner_id=owner_id, name=name, prepared=prepared
        )
    finally:
        staged.discard()
    response.status_code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
    return row


@models_router.get("", response_model=Page[ModelOut], operation_id="list_models")
async def list_models(
    session: SessionDep,
    owner_id: OwnerDep,
    sha256: Sha256 = None,
    limit: Limit = 50,
    cursor: PageCursor = None,
) -> dict[str, object]:
    stmt = select(StoredModel).where(
        StoredModel.owner_id == owner_id, StoredModel.deleted_at.is_(None)
    )
    if sha256:
        stmt = stmt.where(StoredModel.sha256 == sha256)
    rows, next_cursor = await paginate(
        session, stmt, StoredModel, owner_id=owner_id, cursor=cursor, limit=limit
    )
    return {"data": rows, "next_cursor": next_cursor}


@models_router.get(
    "/{model_id}", response_model=ModelOut, operation_id="get_model", responses=NOT_FOUND
)
async def get_model(model_id: StoredText, session: SessionDep, owner_id: OwnerDep) -> StoredModel:
    row = await artifacts.get_owned(session, StoredModel, owner_id, model_id)
    if row is None:
        raise not_found("model")
    return row


@models_router.delete("/{model_id}", status_code=204, operation_id="delete_model", responses=IN_USE)
async def delete_model(
    model_id: StoredText, session: SessionDep, owner_id: OwnerDep, store: StoreDep
) -> Response:
    row = await artifacts.get_owned(session, StoredModel, owner_id, model_id)
    if row is None:
        raise not_found("model")
    await artifacts.delete_artifact(session, store, row)
    return Response(status_code=204)


@datasets_router.post(
    "",
    response_model=DatasetOut,
    status_code=201,
    operation_id="upload_dataset",
    responses={
        200: {"model": DatasetOut, "description": "The same bytes were already uploaded."},
        **UPLOAD_RESPONSES,
    },
)
async def upload_dataset(
    response: Response,
    session: SessionDep,
    owner_id: OwnerDep,
    settings: SettingsDep,
    store: StoreDep,
    file: Annotated[
        UploadFile, File(description="A .pt/.npz/.csv/.jsonl file, or a directory as .tar.gz.")
    ],
    name: Name = None,
    kind: Annotated[StoredText, Form(description="file or directory")] = "file",
) -> StoredDataset:
    staged = await stage_upload(file.file, store.staging_dir(), settings.max_upload_bytes)
    try:
        prepared = await run_in_threadpool(
            artifacts.prepare_dataset,
            staged,
            owner_id=owner_id,
            filename=file.filename,
            kind=kind,
            staging_dir=store.staging_dir(),
            max_extracted_bytes=settings.max_extracted_bytes,
            max_archive_members=settings.max_archive_members,
        )
        row, created = await artifacts.store_artifact(
            session, store, StoredDataset, owner_id=owner_id, name=name, prepared=prepared
        )
    finally:
        staged.discard()
    response.status_code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
    return row


@datasets_router.get("", response_model=Page[DatasetOut], operation_id="list_datasets")
async def list_datasets(
    session: SessionDep,
    owner_id: OwnerDep,
    sha256: Sha256 = None,
    limit: Limit = 50,
    cursor: PageCursor = None,
) -> dict[str, object]:
    stmt = select(StoredDataset).where(
        StoredDataset.owner_id == owner_id, StoredDataset.deleted_at.is_(None)
    )
    if sha256:
        stmt = stmt.where(StoredDataset.sha256 == sha256)
    rows, next_cursor = await paginate(
        session, stmt, StoredDataset, owner_id=owner_id, cursor=cursor, limit=limit
    )
    return {"data": rows, "next_cursor": next_cursor}


@datasets_router.get(
    "/{dataset_id}", response_model=DatasetOut, operation_id="get_dataset", responses=NOT_FOUND
)
async def get_dataset(
    dataset_id: StoredText, session: SessionDep, owner_id: OwnerDep
) -> StoredDataset:
    row = await artifacts.get_owned(session, StoredDataset, owner_id, dataset_id)
    if row is None:
        raise not_found("dataset")
    return row


@datasets_router.delete(
    "/{dataset_id}", status_code=204, operation_id="delete_dataset", responses=IN_USE
)
async def delete_dataset(
    dataset_id: StoredText, session: SessionDep, owner_id: OwnerDep, store: StoreDep
) -> Response:
    row = await artifacts.get_owned(session, StoredDataset, owner_id, dataset_id)
    if row is None:
        raise not_found("dataset")
    await artifacts.delete_artifact(session, store, row)
    return Response(status_code=204)
