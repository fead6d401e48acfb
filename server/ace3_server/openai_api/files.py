"""``/openai/v1/files``: a file is an ACE3 dataset (the same id), uploaded through the same
staging, caps, checks and content-addressed store as ``POST /v1/datasets``
(``UploadGuardMiddleware`` refuses a bad key or an oversized body before it is read). Only
``.jsonl`` files of chat or prompt/completion records are taken (a 400 naming the line; also
a 400 for the bytes of a dataset whose records were named another kind with ``records=``). A
job's ``result_files`` (``ftmetrics-<job id>``) are read here too: its metrics as CSV, streamed
(``openai_api.results``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, File, Form, Query, Request, Response, UploadFile
from fastapi.responses import StreamingResponse
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from ace3.config.text_records import named_records
from ace3_control.models import Job, StoredDataset
from ace3_server.api.deps import OwnerDep, SessionDep, SettingsDep, StoreDep
from ace3_server.api.downloads import stored_file_response
from ace3_server.api.params import StoredText
from ace3_server.openai_api.errors import OpenAIError, OpenAIRoute
from ace3_server.openai_api.objects import METRICS_FILE_PREFIX, file_object, metrics_file_object
from ace3_server.openai_api.owned import owned_job
from ace3_server.openai_api.results import result_csv, result_csv_size
from ace3_server.services import artifacts
from ace3_server.services.pagination import paginate
from ace3_server.services.uploads import StagedUpload, stage_upload

router = APIRouter(prefix="/files", route_class=OpenAIRoute, include_in_schema=False)
FINE_TUNE_RECORDS = ("chat", "prompt_completion")
_HEAD_BYTES = 1 << 20


def _first_record_line(path: Path) -> int:
    """The line number of the file's first non-blank line (1 when none is in its head)."""
    with path.open("rb") as handle:
        head = handle.read(_HEAD_BYTES)
    for number, line in enumerate(head.split(b"\n"), start=1):
        if line.strip():
            return number
    return 1


def prepare_fine_tune_file(staged: StagedUpload, **fields: Any) -> artifacts.PreparedArtifact:
    """``artifacts.prepare_dataset`` for a ``.jsonl`` file, which must hold chat or
    prompt/completion records (400 naming the first record's line otherwise)."""
    name = artifacts.safe_display_name(fields.get("filename"), "data.jsonl")
    if not name.lower().endswith(".jsonl"):
        raise OpenAIError(
            400,
            f"{name}: a fine-tuning file is a .jsonl file of chat or prompt/completion records",
            param="file",
            code="invalid_file_format",
        )
    prepared = artifacts.prepare_dataset(staged, kind="file", **fields)
    layout = prepared.fields.get("batch_layout")
    if layout is None or layout.get("records") in FINE_TUNE_RECORDS:
        return prepared  # (None: a first record longer than the head read; the job reads it)
    found = "text records" if layout.get("records") == "text" else "(inputs, target) records"
    raise OpenAIError(
        400,
        f'{name}: line {_first_record_line(staged.path)}: expected chat records ({{"messages": '
        f'[{{"role": ..., "content": ...}}, ...]}}) or prompt/completion records '
        f'({{"prompt": ..., "completion": ...}}), not {found}',
        param="file",
        code="invalid_file_format",
    )


@router.post("")
async def create_file(
    session: SessionDep,
    owner_id: OwnerDep,
    settings: SettingsDep,
    store: StoreDep,
    file: Annotated[UploadFile, File()],
    purpose: Annotated[str, Form(max_length=64)],
) -> dict[str, Any]:
    if purpose != "fine-tune":
        raise OpenAIError(
            400, f"purpose {purpose!r}: this API takes 'fine-tune' files only", param="purpose"
        )
    staged = await stage_upload(file.file, store.staging_dir(), settings.max_upload_bytes)
    try:
        prepared = await run_in_threadpool(
            prepare_fine_tune_file,
            staged,
            owner_id=owner_id,
            filename=file.filename,
            staging_dir=store.staging_dir(),
            max_extracted_bytes=settings.max_extracted_bytes,
            max_archive_members=settings.max_archive_members,
        )
        row, _ = await artifacts.store_artifact(
            session, store, StoredDataset, owner_id=owner_id, name=None, prepared=prepared
        )
    finally:
        staged.discard()
    named = named_records(row.batch_layout)
    if named is not None and named not in FINE_TUNE_RECORDS:
        # (the same bytes, uploaded before through /v1/datasets with records= naming them so:
        # a job on this file would read them as that kind)
        raise OpenAIError(
            400,
            f"{row.filename}: these bytes are dataset {row.id}, whose records were named "
            f"{named} (records={named!r}); a fine-tuning file holds chat or prompt/completion "
            f"records: upload it through POST /v1/datasets with records='chat' or "
            f"'prompt_completion' (once no unfinished job uses it)",
            param="file",
            code="invalid_file_format",
        )
    return file_object(row)


async def _owned_file(session: SessionDep, owner_id: str, file_id: str) -> StoredDataset:
    row = await artifacts.get_owned(session, StoredDataset, owner_id, file_id)
    if row is None or row.kind != "file":
        raise OpenAIError(404, f"no file with id {file_id!r}", param="file_id")
    return row


async def _result_job(session: SessionDep, owner_id: str, file_id: str) -> Job:
    """The caller's job whose result file ``file_id`` is (404 naming ``file_id`` otherwise)."""
    job_id = file_id.removeprefix(METRICS_FILE_PREFIX)
    return await owned_job(session, owner_id, job_id, param="file_id")


@router.get("")
async def list_files(
    session: SessionDep,
    owner_id: OwnerDep,
    after: Annotated[StoredText | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
    order: Literal["desc"] = "desc",
    purpose: Literal["fine-tune"] | None = None,
) -> dict[str, Any]:
    """The caller's dataset files, newest first."""
    stmt = select(StoredDataset).where(
        StoredDataset.owner_id == owner_id,
        StoredDataset.deleted_at.is_(None),
        StoredDataset.kind == "file",
    )
    rows, next_cursor = await paginate(
        session, stmt, StoredDataset, owner_id=owner_id, cursor=after, limit=min(limit, 1000)
    )
    data = [file_object(row) for row in rows]
    return {"object": "list", "data": data, "has_more": next_cursor is not None}


@router.get("/{file_id}")
async def retrieve_file(file_id: StoredText, session: SessionDep, owner_id: OwnerDep) -> Any:
    if file_id.startswith(METRICS_FILE_PREFIX):
        job = await _result_job(session, owner_id, file_id)
        return metrics_file_object(job, await result_csv_size(session, job.id))
    return file_object(await _owned_file(session, owner_id, file_id))


@router.get("/{file_id}/content")
async def file_content(
    file_id: StoredText,
    request: Request,
    session: SessionDep,
    owner_id: OwnerDep,
    store: StoreDep,
    settings: SettingsDep,
) -> Response:
    if file_id.startswith(METRICS_FILE_PREFIX):
        job = await _result_job(session, owner_id, file_id)
        disposition = f'attachment; filename="{job.id}-metrics.csv"'
        return StreamingResponse(
            result_csv(request.app.state.session_factory, job.id),
            media_type="text/csv",
            headers={"content-disposition": disposition},
        )
    row = await _owned_file(session, owner_id, file_id)
    return await stored_file_response(
        store, settings, row.storage_key, row.size_bytes, row.filename, row.sha256
    )


@router.delete("/{file_id}")
async def delete_file(
    file_id: StoredText, session: SessionDep, owner_id: OwnerDep, store: StoreDep
) -> dict[str, Any]:
    """Deletes the dataset (409 while an unfinished job uses it)."""
    row = await _owned_file(session, owner_id, file_id)
    await artifacts.delete_artifact(session, store, row)
    return {"id": file_id, "object": "file", "deleted": True}
