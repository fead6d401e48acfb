"""Datasets by reference (``POST /v1/datasets/register``): the shards under an s3:// prefix an
administrator allowed, listed into a manifest the dataset row keeps; no byte goes through the
API. The dataset's sha256 is the manifest's digest, so one owner registering the same listing
twice gets the same dataset, and a listing that changed (a shard added, rewritten or removed)
is another dataset. The worker fetches the shards and checks each against the manifest.

Also the checks a job's config needs against the datasets it names (:func:`stream_problems`)."""

from __future__ import annotations

import threading
from typing import Any

from fastapi import HTTPException
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.concurrency import run_in_threadpool

from ace3.config.shards import ShardManifest
from ace3.config.text_records import RecordKind, named_layout
from ace3_control.dataset_sources import SourceProblem, check_source, list_manifest
from ace3_control.models import StoredDataset, utcnow
from ace3_control.settings import Settings
from ace3_control.source_client import source_client
from ace3_server.dataset_schemas import DatasetRegister
from ace3_server.errors import field_error
from ace3_server.services.artifacts import rename_records
from ace3_server.services.batch_fit import batch_layout_of_format
from ace3_server.storable import INT64_MAX

#: Dataset kinds whose data is streamed shard by shard.
SHARDED_KINDS = ("remote", "shards")
#: The largest manifest (as JSON) one dataset row keeps.
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
#: Registrations one API process lists at once; more are answered 429.
MAX_REGISTRATIONS = 4
#: Seconds a client waits before registering again after a 429.
REGISTRATION_RETRY_SECONDS = 10
_registrations = threading.BoundedSemaphore(MAX_REGISTRATIONS)


def format_field_problems(
    format: str, dtype: str | None, columns: object | None, records: str | None = None
) -> list[dict[str, Any]]:
    """422 entries for ``dtype`` given for another format than tokens, ``columns`` for another
    than parquet, ``records`` for another than jsonl (registered and uploaded sharded datasets
    alike)."""
    problems = []
    if records is not None and format != "jsonl":
        problems.append(
            {
                "loc": ["body", "records"],
                "msg": f"records is for format='jsonl' (the kind of its text records), not "
                f"{format!r}",
                "type": "value_error",
            }
        )
    if dtype is not None and format != "tokens":
        problems.append(
            {
                "loc": ["body", "dtype"],
                "msg": f"dtype is for format='tokens' (the token ids' type), not {format!r}",
                "type": "value_error",
            }
        )
    if columns is not None and format != "parquet":
        problems.append(
            {
                "loc": ["body", "columns"],
                "msg": f"columns is for format='parquet' (the columns read as inputs and "
                f"targets), not {format!r}",
                "type": "value_error",
            }
        )
    return problems


def _manifest(settings: Settings, body: DatasetRegister) -> ShardManifest:
    """The listing (blocking: run off the event loop)."""
    check_source(settings, body.uri)
    columns = {str(key): value for key, value in (body.columns or {}).items()} or None
    return list_manifest(
        source_client(settings),
        body.uri,
        body.format,
        dtype=body.dtype,
        columns=columns,
        listing_seconds=settings.dataset_listing_seconds,
    )


def _display_name(uri: str) -> str:
    """``s3://bucket/team/corpus/`` -> ``corpus`` (the bucket for a whole bucket)."""
    return uri.removeprefix("s3://").rstrip("/").rsplit("/", 1)[-1][:255]


async def register_dataset(
    session: AsyncSession, settings: Settings, owner_id: str, body: DatasetRegister
) -> tuple[StoredDataset, bool]:
    """(the dataset, created): the owner's dataset of this listing (200), or a new one (201).
    422 naming ``uri`` when it may not be read or holds no shards, or the field at fault."""
    problems = format_field_problems(body.format, body.dtype, body.columns, body.records)
    if problems:
        raise HTTPException(status_code=422, detail=problems)
    if not _registrations.acquire(blocking=False):
        raise HTTPException(
            status_code=429,
            detail=f"this server is listing {MAX_REGISTRATIONS} datasets already: register "
            f"again in {REGISTRATION_RETRY_SECONDS} seconds",
            headers={"Retry-After": str(REGISTRATION_RETRY_SECONDS)},
        )
    try:
        manifest = await run_in_threadpool(_manifest, settings, body)
    except SourceProblem as exc:
        raise field_error(["body", exc.field], str(exc)) from None
    finally:
        _registrations.release()
    name = body.name or _display_name(manifest.uri)
    return await save_manifest_dataset(
        session,
        owner_id,
        manifest,
        kind="remote",
        name=name,
        filename=_display_name(manifest.uri),
        uri=manifest.uri,
        loc=["body", "uri"],
        records=body.records,
    )


def _digest_and_dump(manifest: ShardManifest) -> tuple[str, dict[str, Any], int]:
    """(digest, the manifest as JSON data, its size as JSON text) (blocking: off the loop)."""
    document = manifest.model_dump(mode="json")
    return manifest.digest(), document, len(manifest.model_dump_json())


async def save_manifest_dataset(
    session: AsyncSession,
    owner_id: str,
    manifest: ShardManifest,
    *,
    kind: str,
    name: str,
    filename: str,
    uri: str | None,
    loc: list[str | int],
    records: RecordKind | None = None,
) -> tuple[StoredDataset, bool]:
    """(the dataset, created) of a sharded dataset: the owner's dataset of this manifest's
    digest, a deleted one revived (created), or a new row; ``storage_key`` is the manifest's
    ``uri`` (a bucket prefix, or the store's key prefix of uploaded shards). Commits. 422
    naming ``loc`` when the manifest is larger than :data:`MAX_MANIFEST_BYTES` as JSON."""
    digest, document, size = await run_in_threadpool(_digest_and_dump, manifest)
    if size > MAX_MANIFEST_BYTES:
        await session.rollback()
        raise field_error(
            loc,
            f"the dataset's manifest would be {size} bytes, more than the {MAX_MANIFEST_BYTES} "
            "bytes one dataset may have: fewer shards, or shorter names",
        )
    if (manifest.total_samples or 0) > INT64_MAX:
        await session.rollback()
        raise field_error(loc, f"the shards hold more than {INT64_MAX} samples in all")
    identity = [StoredDataset.owner_id == owner_id, StoredDataset.sha256 == digest]
    existing = await session.scalar(select(StoredDataset).where(*identity))
    layout = named_layout(records) if records else batch_layout_of_format(manifest.format)
    if existing is not None and records is not None and existing.deleted_at is None:
        await rename_records(session, existing, layout)  # (the same shards, named now)
    elif existing is not None and records is not None:
        existing.batch_layout = layout  # (revived below: no job uses a deleted dataset)
    if existing is not None and existing.deleted_at is None:
        await session.commit()
        return existing, False
    if existing is not None:  # deleted before: the same manifest again, revived
        existing.deleted_at = None
        existing.created_at = utcnow()
        existing.name = name
        await session.commit()
        return existing, True
    row = StoredDataset(
        owner_id=owner_id,
        name=name,
        filename=filename,
        kind=kind,
        format=manifest.format,
        sha256=digest,
        size_bytes=manifest.total_bytes,
        storage_key=manifest.uri,
        uri=uri,
        manifest=document,
        shard_count=len(manifest.shards),
        samples=manifest.total_samples,
        batch_layout=layout,
    )
    session.add(row)
    try:
        await session.commit()
    except IntegrityError:  # the same manifest stored concurrently: the winner's row
        await session.rollback()
        winner = await session.scalar(select(StoredDataset).where(*identity))
        if winner is None:  # pragma: no cover - the conflicting row must exist
            raise
        return winner, False
    return row, True


def stream_problems(
    config: Any, datasets: dict[str, StoredDataset], loc: list[str | int]
) -> list[dict[str, Any]]:
    """What a job's (or a search's base) ``config`` lacks for the sharded datasets it names
    (``datasets``: the request field -> the owned row): a tokens dataset needs
    ``sequence_length``; a training stream whose sample count is unknown (jsonl, webdataset)
    cannot count ``epochs`` and needs ``max_steps`` (text records in jsonl shards too: what
    the model and the records need is :mod:`ace3_server.services.batch_fit`'s)."""
    problems: list[dict[str, Any]] = []
    sharded = {field: row for field, row in datasets.items() if row.kind in SHARDED_KINDS}
    tokens = [field for field, row in sharded.items() if row.format == "tokens"]
    if tokens and config.sequence_length is None:
        problems.append(
            {
                "loc": [*loc, "sequence_length"],
                "msg": f"{tokens[0]} is a 'tokens' dataset: set sequence_length, the tokens per "
                "sample (windows of sequence_length + 1 ids)",
                "type": "value_error",
            }
        )
    train = sharded.get("dataset_id")
    if train is None or train.samples is not None or train.format in ("tokens", "parquet"):
        return problems
    if config.epochs is not None:
        problems.append(
            {
                "loc": [*loc, "epochs"],
                "msg": f"the sample count of {train.format} shards is not recorded, so an epoch "
                "has no length: leave epochs unset and set max_steps (the stream cycles)",
                "type": "value_error",
            }
        )
    elif config.max_steps is None:
        problems.append(
            {
                "loc": [*loc, "max_steps"],
                "msg": f"the sample count of {train.format} shards is not recorded: set "
                "max_steps, the optimizer steps to train (the stream cycles)",
                "type": "value_error",
            }
        )
    return problems
