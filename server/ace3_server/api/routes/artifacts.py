"""Models and datasets: upload, list, get, delete (two routers over one service), and datasets
registered by reference (``POST /v1/datasets/register``: shards in a bucket, no upload).

Uploads are authenticated before their body is read (``middleware.UploadGuardMiddleware``).
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, File, Form, Path, Query, Response, UploadFile, status
from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.concurrency import run_in_threadpool

from ace3.config.text_records import RecordKind
from ace3_control.models import StoredDataset, StoredModel
from ace3_control.settings import Settings
from ace3_control.storage import ArtifactStore
from ace3_server.api.deps import OwnerDep, SessionDep, SettingsDep, StoreDep
from ace3_server.api.params import PageCursor, StoredText
from ace3_server.api.routing import ErrorOut, error_responses, resource_router
from ace3_server.dataset_schemas import DatasetOut, DatasetRegister
from ace3_server.errors import not_found
from ace3_server.schemas import ModelOut, Page
from ace3_server.services import artifacts
from ace3_server.services.dataset_registry import register_dataset
from ace3_server.services.hf_models import HUGGINGFACE, prepare_hf_model
from ace3_server.services.pagination import paginate
from ace3_server.services.uploads import stage_upload

Stored = StoredModel | StoredDataset
StoredT = TypeVar("StoredT", StoredModel, StoredDataset)

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


@dataclass
class _Upload:
    """One upload request of a model or a dataset: stage the body, prepare it (checked and
    unpacked off the event loop), store it once per content hash; 201 when new, 200 when the
    owner had these bytes already."""

    response: Response
    session: AsyncSession
    owner_id: str
    settings: Settings
    store: ArtifactStore
    file: UploadFile
    name: str | None

    async def stored(
        self, table: type[StoredT], prepare: Callable[..., Any], fields: dict[str, Any]
    ) -> StoredT:
        store, settings = self.store, self.settings
        staged = await stage_upload(self.file.file, store.staging_dir(), settings.max_upload_bytes)
        try:
            prepared = await run_in_threadpool(
                prepare,
                staged,
                owner_id=self.owner_id,
                filename=self.file.filename,
                **fields,
                staging_dir=store.staging_dir(),
                max_extracted_bytes=settings.max_extracted_bytes,
                max_archive_members=settings.max_archive_members,
            )
            row, created = await artifacts.store_artifact(
                self.session, store, table, owner_id=self.owner_id, name=self.name,
                prepared=prepared,
            )  # fmt: skip
        finally:
            staged.discard()
        self.response.status_code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
        return row


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
    file: Annotated[
        UploadFile,
        File(
            description="A .py file, an archive of a package, or (kind=huggingface) an "
            "archive of a Hugging Face model directory."
        ),
    ],
    name: Name = None,
    factory: Annotated[StoredText, Form(max_length=200)] = "build_model",
    entry_module: Annotated[StoredText | None, Form(max_length=200)] = None,
    kind: Annotated[
        Literal["huggingface"] | None,
        Form(
            description="huggingface: the archive holds a Hugging Face model directory "
            "(config.json and safetensors weights at its top), built in the job with "
            "from_pretrained. Left out: a .py file or a package archive (with entry_module)."
        ),
    ] = None,
) -> StoredModel:
    upload = _Upload(response, session, owner_id, settings, store, file, name)
    fields = {"factory": factory, "entry_module": entry_module}
    prepare = prepare_hf_model if kind == HUGGINGFACE else artifacts.prepare_model
    return await upload.stored(StoredModel, prepare, fields)


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
    records: Annotated[
        RecordKind | None,
        Form(
            description="The kind of a .jsonl file's text records (chat, prompt_completion, "
            "text), which its first records must be; left out, the first record tells."
        ),
    ] = None,
) -> StoredDataset:
    upload = _Upload(response, session, owner_id, settings, store, file, name)
    fields = {"kind": kind, "records": records}
    return await upload.stored(StoredDataset, artifacts.prepare_dataset, fields)


@datasets_router.post(
    "/register",
    response_model=DatasetOut,
    status_code=201,
    operation_id="register_dataset",
    responses={
        200: {"model": DatasetOut, "description": "You registered the same listing already."},
        429: {
            "model": ErrorOut,
            "description": "This server is listing as many datasets as it lists at once; "
            "register again after the Retry-After header's seconds.",
        },
        **error_responses(400),
    },
)
async def register_remote_dataset(
    body: DatasetRegister,
    response: Response,
    session: SessionDep,
    owner_id: OwnerDep,
    settings: SettingsDep,
) -> StoredDataset:
    """Register the shards under an s3:// prefix the service may read (ACE3_DATASET_SOURCES)
    as a dataset: the service lists them into a manifest (each shard's name, size and ETag;
    parquet row counts) and streams them to the jobs that train on it. 201 when new, 200 when
    you registered the same listing before; a listing that changed is a new dataset. 422
    naming ``uri`` when the listing examines too many objects or takes too long
    (ACE3_DATASET_LISTING_SECONDS); 429 when the server lists too many datasets at once."""
    row, created = await register_dataset(session, settings, owner_id, body)
    response.status_code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
    return row


def _add_read_routes(
    router: APIRouter,
    table: type[Stored],
    out: type[BaseModel],
    page: type[BaseModel],
    kind: str,
) -> None:
    """``GET ""`` (list, by sha256), ``GET /{<kind>_id}`` and ``DELETE /{<kind>_id}`` of one
    kind of stored artifact, with the operation ids ``list_<kind>s``, ``get_<kind>`` and
    ``delete_<kind>``: the same logic for models and datasets. (This module keeps its
    annotations evaluated: FastAPI reads ``ItemId``, a local name, from them.)"""
    ItemId = Annotated[StoredText, Path(alias=f"{kind}_id")]

    async def list_items(
        session: SessionDep,
        owner_id: OwnerDep,
        sha256: Sha256 = None,
        limit: Limit = 50,
        cursor: PageCursor = None,
    ) -> dict[str, object]:
        stmt = select(table).where(table.owner_id == owner_id, table.deleted_at.is_(None))
        if sha256:
            stmt = stmt.where(table.sha256 == sha256)
        rows, next_cursor = await paginate(
            session, stmt, table, owner_id=owner_id, cursor=cursor, limit=limit
        )
        return {"data": rows, "next_cursor": next_cursor}

    async def get_item(item_id: ItemId, session: SessionDep, owner_id: OwnerDep) -> Stored:
        row = await artifacts.get_owned(session, table, owner_id, item_id)
        if row is None:
            raise not_found(kind)
        return row

    async def delete_item(
        item_id: ItemId, session: SessionDep, owner_id: OwnerDep, store: StoreDep
    ) -> Response:
        row = await artifacts.get_owned(session, table, owner_id, item_id)
        if row is None:
            raise not_found(kind)
        await artifacts.delete_artifact(session, store, row)
        return Response(status_code=204)

    router.get(
        "", response_model=page, operation_id=f"list_{kind}s", summary=f"List {kind.title()}s"
    )(list_items)
    router.get(
        f"/{{{kind}_id}}",
        response_model=out,
        operation_id=f"get_{kind}",
        summary=f"Get {kind.title()}",
        responses=NOT_FOUND,
    )(get_item)
    router.delete(
        f"/{{{kind}_id}}",
        status_code=204,
        operation_id=f"delete_{kind}",
        summary=f"Delete {kind.title()}",
        responses=IN_USE,
    )(delete_item)


_add_read_routes(models_router, StoredModel, ModelOut, Page[ModelOut], "model")
_add_read_routes(datasets_router, StoredDataset, DatasetOut, Page[DatasetOut], "dataset")
