"""Models, datasets and uploaded weights: validated, content-addressed per owner, soft-deleted.

The same bytes uploaded twice by one owner are stored once: the second upload returns the
existing record. Deleting keeps the row (old jobs still name it) but frees the stored bytes.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import HTTPException
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.concurrency import run_in_threadpool

from ace3.config.text_records import RecordKind, named_records
from ace3_control.models import (
    ACTIVE_SEARCH_STATES,
    Job,
    Search,
    StoredDataset,
    StoredModel,
    UploadedCheckpoint,
    utcnow,
)
from ace3_control.storage import ArtifactStore, tree_digest
from ace3_control.weights_users import UNFINISHED_JOB_STATES, in_use_message, weights_users
from ace3_server.archives import (
    DEFAULT_MAX_MEMBERS,
    UnsafeArchiveError,
    is_archive_name,
    safe_extract,
)
from ace3_server.errors import field_error
from ace3_server.services.job_requirements import read_package_requirements
from ace3_server.services.shard_store import delete_unshared_shards
from ace3_server.services.uploads import StagedUpload
from ace3_server.storable import text_problem
from ace3_server.upload_checks import UploadCheckError
from ace3_server.upload_checks.datasets import check_dataset_file, check_dataset_tree
from ace3_server.upload_checks.model_forward import forward_signature
from ace3_server.upload_checks.model_source import check_model_source
from ace3_server.upload_checks.text_data import RecordsError

DATASET_FILE_FORMATS = {".pt": "pt", ".npz": "npz", ".csv": "csv", ".jsonl": "jsonl"}
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass
class PreparedArtifact:
    """What to store: a file or directory staged on disk, and the row fields describing it."""

    source: Path
    storage_key: str
    fields: dict[str, Any]


def safe_display_name(filename: str | None, fallback: str) -> str:
    name = Path(filename or fallback).name
    problem = text_problem(name)
    if problem is not None:
        raise field_error(["body", "file"], f"the file name {problem}")
    return name[:255] or fallback


def refuse(problem: UploadCheckError, prefix: str = "") -> HTTPException:
    """A checker's problem as the API's 422 on the uploaded file."""
    return field_error(["body", "file"], f"{prefix}{problem}")


def _entry_module_file(tree: Path, entry_module: str) -> Path | None:
    """The file Python imports for ``entry_module`` from ``tree`` (a package before a module)."""
    relative = Path(*entry_module.split("."))
    for candidate in (tree / relative / "__init__.py", (tree / relative).with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def extract_staged(
    staged: StagedUpload, filename: str, staging_dir: Path, max_bytes: int, max_members: int
) -> Path:
    tree = Path(tempfile.mkdtemp(dir=staging_dir, prefix="tree-"))
    try:
        safe_extract(
            staged.path, tree, filename=filename, max_total_bytes=max_bytes, max_members=max_members
        )
    except BaseException as exc:
        shutil.rmtree(tree, ignore_errors=True)
        if isinstance(exc, UnsafeArchiveError):
            raise field_error(["body", "file"], str(exc)) from exc
        raise
    return tree


def prepare_model(
    staged: StagedUpload,
    *,
    owner_id: str,
    filename: str | None,
    factory: str,
    entry_module: str | None,
    staging_dir: Path,
    max_extracted_bytes: int,
    max_archive_members: int = DEFAULT_MAX_MEMBERS,
) -> PreparedArtifact:
    display = safe_display_name(filename, "model.py")
    if not _IDENTIFIER.match(factory):
        raise field_error(["body", "factory"], f"{factory!r} is not a Python identifier")
    if display.endswith(".py"):
        entry_module = None  # a single file is its own entry module
    variant = f"{factory}|{entry_module or ''}"
    variant_digest = hashlib.sha256(variant.encode()).hexdigest()[:16]
    base_key = f"models/{owner_id}/{staged.sha256}-{variant_digest}"
    if display.endswith(".py"):
        try:
            source = check_model_source(staged.path.read_bytes(), display, factory)
        except UploadCheckError as exc:
            raise refuse(exc) from None
        fields: dict[str, Any] = {
            "kind": "file",
            "entry_module": None,
            "variant": variant,
            "requirements": None,
            "forward_signature": forward_signature(source, factory),
        }
        return PreparedArtifact(
            staged.path, f"{base_key}/model.py", fields | stored_fields(display, factory, staged)
        )
    if not is_archive_name(display):
        raise field_error(
            ["body", "file"], f"{display}: expected a .py file or a .tar.gz/.tgz/.tar/.zip archive"
        )
    if not entry_module or not _DOTTED.match(entry_module):
        raise field_error(
            ["body", "entry_module"],
            "an archive needs entry_module, the dotted module that defines the factory (e.g. "
            "mypkg.model); a Hugging Face model directory is uploaded with kind=huggingface",
        )
    tree = extract_staged(staged, display, staging_dir, max_extracted_bytes, max_archive_members)
    relative = Path(*entry_module.split("."))
    entry_file = _entry_module_file(tree, entry_module)
    if entry_file is None:
        shutil.rmtree(tree, ignore_errors=True)
        raise field_error(
            ["body", "entry_module"], f"the archive has no module {entry_module!r} ({relative}.py)"
        )
    try:
        entry_name = entry_file.relative_to(tree).as_posix()
        source = check_model_source(entry_file.read_bytes(), entry_name, factory)
    except UploadCheckError as exc:
        shutil.rmtree(tree, ignore_errors=True)
        raise refuse(exc, f"{display}: ") from None
    try:
        requirements = read_package_requirements(tree, entry_module)
    except ValueError as exc:  # (a RequirementError names the entry)
        shutil.rmtree(tree, ignore_errors=True)
        raise field_error(["body", "file"], f"{display}: {exc}") from None
    fields = {
        "kind": "archive",
        "entry_module": entry_module,
        "variant": variant,
        "requirements": requirements,
        "tree_sha256": tree_digest(tree),
        "forward_signature": forward_signature(source, factory),
    }
    return PreparedArtifact(
        tree, f"{base_key}/tree", fields | stored_fields(display, factory, staged)
    )


def stored_fields(display: str, factory: str, staged: StagedUpload) -> dict[str, Any]:
    return {
        "filename": display,
        "factory": factory,
        "sha256": staged.sha256,
        "size_bytes": staged.size_bytes,
    }


def _has_data(tree: Path) -> bool:
    if (tree / "dataset.py").is_file():
        return True
    return any(p.suffix in DATASET_FILE_FORMATS for p in tree.rglob("*") if p.is_file())


def prepare_dataset(
    staged: StagedUpload,
    *,
    owner_id: str,
    filename: str | None,
    kind: str,
    staging_dir: Path,
    max_extracted_bytes: int,
    max_archive_members: int = DEFAULT_MAX_MEMBERS,
    records: RecordKind | None = None,
) -> PreparedArtifact:
    display = safe_display_name(filename, "dataset")
    base_key = f"datasets/{owner_id}/{staged.sha256}"
    common = {"filename": display, "sha256": staged.sha256, "size_bytes": staged.size_bytes}
    if kind == "file":
        suffix = Path(display).suffix.lower()
        data_format = DATASET_FILE_FORMATS.get(suffix)
        if data_format is None:
            expected = ", ".join(sorted(DATASET_FILE_FORMATS))
            raise field_error(
                ["body", "file"],
                f"{display}: unsupported dataset format {suffix or '(none)'!r}; expected one of "
                f"{expected}, or a directory (kind=directory)",
            )
        try:
            layout = check_dataset_file(staged.path, data_format, records)
        except RecordsError as exc:
            raise field_error(["body", "records"], f"{display}: {exc}") from None
        except UploadCheckError as exc:
            raise refuse(exc, f"{display}: ") from None
        key = f"{base_key}/data{suffix}"
        fields: dict[str, Any] = {"kind": "file", "format": data_format, "batch_layout": layout}
        return PreparedArtifact(staged.path, key, common | fields)
    if kind != "directory":
        raise field_error(["body", "kind"], f"kind must be 'file' or 'directory', not {kind!r}")
    if not is_archive_name(display):
        raise field_error(
            ["body", "file"], f"{display}: a directory is uploaded as a .tar.gz, .tar or .zip"
        )
    tree = extract_staged(staged, display, staging_dir, max_extracted_bytes, max_archive_members)
    if not _has_data(tree):
        shutil.rmtree(tree, ignore_errors=True)
        expected = ", ".join(sorted(DATASET_FILE_FORMATS))
        raise field_error(
            ["body", "file"], f"the directory holds no dataset.py and no data file ({expected})"
        )
    try:
        tree_layout = check_dataset_tree(tree, records)
    except RecordsError as exc:
        shutil.rmtree(tree, ignore_errors=True)
        raise field_error(["body", "records"], f"{display}: {exc}") from None
    except UploadCheckError as exc:
        shutil.rmtree(tree, ignore_errors=True)
        raise refuse(exc, f"{display}: ") from None
    fields = {
        "kind": "directory",
        "format": "directory",
        "tree_sha256": tree_digest(tree),
        "batch_layout": tree_layout,
    }
    return PreparedArtifact(tree, f"{base_key}/tree", common | fields)


async def store_artifact(
    session: AsyncSession,
    store: ArtifactStore,
    model: type[StoredModel] | type[StoredDataset] | type[UploadedCheckpoint],
    *,
    owner_id: str,
    name: str | None,
    prepared: PreparedArtifact,
) -> tuple[Any, bool]:
    """Insert the record (or revive a deleted one); return (row, created)."""
    identity = [model.owner_id == owner_id, model.sha256 == prepared.fields["sha256"]]
    if model is StoredModel:
        identity.append(StoredModel.variant == prepared.fields["variant"])
    existing: Any = await session.scalar(select(model).where(*identity))
    named = named_records(prepared.fields.get("batch_layout")) if model is StoredDataset else None
    if existing is not None and existing.deleted_at is None:
        _discard(prepared.source)
        if model is StoredModel and existing.requirements != prepared.fields["requirements"]:
            # (a package stored before requirements.txt was read: the same bytes, read now)
            existing.requirements = prepared.fields["requirements"]
            await session.commit()
        if named is not None and existing.batch_layout != prepared.fields["batch_layout"]:
            await rename_records(session, existing, prepared.fields["batch_layout"])
            await session.commit()  # (records= named now)
        return existing, False
    await run_in_threadpool(store.put_file, prepared.storage_key, prepared.source)
    if existing is not None:
        existing.deleted_at = None
        existing.created_at = utcnow()
        existing.name = name or existing.name
        existing.storage_key = prepared.storage_key
        if model is StoredModel:
            existing.requirements = prepared.fields["requirements"]
        if model is not UploadedCheckpoint:  # (the tree just stored, when it is one)
            existing.tree_sha256 = prepared.fields.get("tree_sha256")
        if named is not None:
            existing.batch_layout = prepared.fields["batch_layout"]
        await session.commit()
        return existing, True
    row = model(
        owner_id=owner_id,
        name=name or prepared.fields["filename"],
        storage_key=prepared.storage_key,
        **prepared.fields,
    )
    session.add(row)
    try:
        await session.commit()
    except IntegrityError:
        # A concurrent upload of the same bytes won the race: return its record.
        await session.rollback()
        winner = await session.scalar(select(model).where(*identity))
        if winner is None:  # pragma: no cover - the conflicting row must exist
            raise
        return winner, False
    return row, True


def _discard(source: Path) -> None:
    if source.is_dir():
        shutil.rmtree(source, ignore_errors=True)
    else:
        source.unlink(missing_ok=True)


async def get_owned(session: AsyncSession, model: Any, owner_id: str, item_id: str) -> Any | None:
    row = await session.get(model, item_id)
    if row is None or row.owner_id != owner_id or row.deleted_at is not None:
        return None
    return row


async def _unfinished_users(session: AsyncSession, row: Any) -> list[str]:
    """Who still needs ``row``: the jobs and the searches that have not finished and use it
    (``job <id>``, ``search <id>``; a search's trials' jobs are made later, from its row)."""
    if isinstance(row, UploadedCheckpoint):
        return [user for _, user in (await session.execute(weights_users([row.id]))).all()]
    if isinstance(row, StoredDataset):
        in_job = (Job.dataset_id == row.id) | (Job.validation_dataset_id == row.id)
        in_search = (Search.dataset_id == row.id) | (Search.validation_dataset_id == row.id)
    else:  # the model a job trains, or the teacher it distils from
        teacher = Job.config[("distillation", "teacher_model_id")].as_string()
        in_job = (Job.model_id == row.id) | (teacher == row.id)
        base_teacher = Search.config[("base_config", "distillation", "teacher_model_id")]
        in_search = (Search.model_id == row.id) | (base_teacher.as_string() == row.id)
    jobs = await session.scalars(
        select(Job.id).where(in_job, Job.state.in_(UNFINISHED_JOB_STATES)).order_by(Job.id)
    )
    users = [f"job {job_id}" for job_id in jobs]
    searches = await session.scalars(
        select(Search.id)
        .where(in_search, Search.state.in_(ACTIVE_SEARCH_STATES))
        .order_by(Search.id)
    )
    return users + [f"search {search_id}" for search_id in searches]


def _records_kind(layout: Any) -> str | None:
    """The kind of text records a batch layout says (named or told), None for none."""
    return layout.get("records") if isinstance(layout, dict) else None


async def rename_records(session: AsyncSession, row: StoredDataset, layout: Any) -> None:
    """Give a live dataset the batch layout ``layout`` (``records=`` named on the same bytes
    again). Refused (409, naming them) when that changes the kind of its records while jobs or
    searches that have not finished use it: they were checked against the kind they were
    submitted with, and every attempt of a job reads the kind again from the row."""
    old, new = _records_kind(row.batch_layout), _records_kind(layout)
    if old != new and (users := await _unfinished_users(session, row)):
        detail = (
            f"dataset {row.name!r} holds {old or 'no text'} records: naming them "
            f"{new or 'otherwise'} is refused while it is {in_use_message(users)}"
        )
        await session.rollback()
        raise HTTPException(status_code=409, detail=detail)
    row.batch_layout = layout


async def delete_artifact(session: AsyncSession, store: ArtifactStore, row: Any) -> None:
    """Delete the owner's model, dataset or uploaded weights: the row is kept, marked deleted
    (old jobs still name it; the same bytes uploaded again revive it), and the stored bytes go.
    Refused (409, naming them) while jobs or searches that have not finished use it."""
    users = await _unfinished_users(session, row)
    if users:
        raise HTTPException(status_code=409, detail=in_use_message(users))
    row.deleted_at = utcnow()
    await session.commit()
    if isinstance(row, StoredDataset) and row.kind == "remote":
        return  # its storage_key is the bucket prefix it was registered from: never deleted
    if isinstance(row, StoredDataset) and row.kind == "shards":
        # uploaded shards: those no other live dataset of the owner names go with it
        await delete_unshared_shards(session, store, row)
        return
    await run_in_threadpool(store.delete, row.storage_key)
