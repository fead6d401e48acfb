"""A dataset of uploaded shards (``POST /v1/datasets/shards``, kind ``shards``): the shards an
owner stored (:mod:`ace3_server.services.shard_store`), named by their paths in the uploaded
directory, checked against the format, into the same manifest a registered dataset has.

The manifest's ``uri`` is the store's key prefix of the owner's shards and each shard's ``etag``
its sha256, so its object is ``uri + etag`` in the artifact store and the worker verifies what
it fetches by hashing it. The same shards under the same names are the same manifest, so the
same digest: uploading a directory twice gives one dataset (200 the second time)."""

from __future__ import annotations

import io
from typing import Any

from fastapi import HTTPException
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.concurrency import run_in_threadpool

from ace3.config.shards import SHARD_SUFFIXES, Shard, ShardManifest, shard_suffix
from ace3_control.dataset_sources import DEFAULT_COLUMNS, parquet_footer, read_footers
from ace3_control.models import StoredDataset
from ace3_control.storage import ArtifactStore
from ace3_control.storage.s3 import S3ArtifactStore
from ace3_server.errors import field_error
from ace3_server.services.dataset_registry import format_field_problems, save_manifest_dataset
from ace3_server.services.shard_store import lock_shards, shard_key, shard_prefix, stored_sizes
from ace3_server.shard_schemas import ShardDatasetCreate

_ITEMSIZE = {"uint16": 2, "uint32": 4}
#: Problems listed in one 422 (the first ones).
MAX_LISTED = 20
#: Names one stored shard may have in one dataset: without a bound, one tiny shard stored once
#: could be listed under 100,000 names.
MAX_NAMES_PER_SHARD = 1


def _problem(loc: list[str | int], msg: str, type_: str = "value_error") -> dict[str, Any]:
    return {"loc": loc, "msg": msg, "type": type_}


def _entry_problems(body: ShardDatasetCreate, dtype: str | None) -> list[dict[str, Any]]:
    """Names (usable, unique, the format's endings) and, for tokens, whole token ids."""
    problems: list[dict[str, Any]] = []
    seen: set[str] = set()
    names_of: dict[str, list[str]] = {}
    endings = ", ".join(SHARD_SUFFIXES[body.format])
    for index, entry in enumerate(body.shards):
        where: list[str | int] = ["body", "shards", index]
        names = names_of.setdefault(entry.sha256, [])
        if len(names) >= MAX_NAMES_PER_SHARD:
            problems.append(
                _problem(
                    [*where, "sha256"],
                    f"shard {entry.name!r} has the same bytes (sha256 {entry.sha256}) as shard "
                    f"{names[0]!r}: a dataset names each stored shard at most "
                    f"{MAX_NAMES_PER_SHARD} time(s); leave out the copies",
                )
            )
            if len(problems) >= MAX_LISTED:
                break
            continue
        names.append(entry.name)
        try:
            Shard(name=entry.name, size=entry.size, etag=entry.sha256)
        except ValidationError as exc:
            message = exc.errors()[0]["msg"].removeprefix("Value error, ")
            problems.append(_problem([*where, "name"], message))
            continue
        if entry.name in seen:
            problems.append(_problem([*where, "name"], f"shard {entry.name!r} is listed twice"))
        seen.add(entry.name)
        if shard_suffix(body.format, entry.name) is None:
            problems.append(
                _problem(
                    [*where, "name"],
                    f"shard {entry.name!r} is not a {body.format} shard (its name must end in "
                    f"{endings})",
                )
            )
        if dtype is not None and entry.size % _ITEMSIZE[dtype]:
            problems.append(
                _problem(
                    [*where, "size"],
                    f"shard {entry.name!r} has {entry.size} bytes, not a whole number of "
                    f"{dtype} token ids ({_ITEMSIZE[dtype]} bytes each): is the dtype right?",
                )
            )
    return problems


async def _storage_problems(
    session: AsyncSession, owner_id: str, body: ShardDatasetCreate
) -> list[dict[str, Any]]:
    """Each shard must be stored by this owner, with the size given."""
    sizes = await stored_sizes(session, owner_id, (entry.sha256 for entry in body.shards))
    problems = []
    for index, entry in enumerate(body.shards):
        stored = sizes.get(entry.sha256)
        if stored is None:
            problems.append(
                _problem(
                    ["body", "shards", index, "sha256"],
                    f"shard {entry.name!r} (sha256 {entry.sha256}) is not stored: upload it "
                    "first (client.load_dataset(directory, format=...) uploads what is missing)",
                    "shard_not_stored",
                )
            )
        elif stored != entry.size:
            problems.append(
                _problem(
                    ["body", "shards", index, "size"],
                    f"shard {entry.name!r}: the stored shard of sha256 {entry.sha256} has "
                    f"{stored} bytes, not {entry.size}",
                )
            )
    return problems


def _refuse(problems: list[dict[str, Any]]) -> HTTPException:
    return HTTPException(status_code=422, detail=problems[:MAX_LISTED])


class _OpenedRanges:
    """``get_object(Bucket, Key, Range)`` over a store whose objects open as seekable files (the
    local store): what :func:`parquet_footer` reads footers with."""

    def __init__(self, store: ArtifactStore) -> None:
        self.store = store

    def get_object(self, *, Bucket: str, Key: str, Range: str) -> dict[str, Any]:
        first, last = (int(end) for end in Range.removeprefix("bytes=").split("-"))
        with self.store.open(Key) as handle:
            handle.seek(first)
            return {"Body": io.BytesIO(handle.read(last - first + 1))}


def _footer(store: ArtifactStore, key: str, size: int) -> tuple[int, list[str]]:
    if isinstance(store, S3ArtifactStore):
        return parquet_footer(store.client, store.bucket, store.prefix + key, size)
    return parquet_footer(_OpenedRanges(store), "", key, size)


def _count_rows(
    store: ArtifactStore, owner_id: str, body: ShardDatasetCreate, columns: dict[str, str]
) -> list[int]:
    """Each shard's rows, from the footers of the distinct stored shards (blocking)."""
    first_of: dict[str, int] = {}
    for index, entry in enumerate(body.shards):
        first_of.setdefault(entry.sha256, index)

    def read(index: int) -> tuple[int, list[str]]:
        entry = body.shards[index]
        try:
            return _footer(store, shard_key(owner_id, entry.sha256), entry.size)
        except ValueError as exc:
            raise field_error(
                ["body", "shards", index, "name"], f"shard {entry.name!r} is not parquet: {exc}"
            ) from None

    footers = dict(zip(first_of, read_footers(read, first_of.values()), strict=True))
    for sha256, (_, names) in footers.items():
        missing = [column for column in columns.values() if column not in names]
        if missing:
            entry = body.shards[first_of[sha256]]
            raise field_error(
                ["body", "columns"],
                f"shard {entry.name!r} has no column {missing[0]!r} (its columns: "
                f"{', '.join(names[:20]) or 'none'}): name the inputs and targets columns with "
                "columns={'inputs': ..., 'targets': ...}",
            )
    return [footers[entry.sha256][0] for entry in body.shards]


def _manifest(
    owner_id: str,
    body: ShardDatasetCreate,
    dtype: str | None,
    columns: dict[str, str] | None,
    rows: list[int] | None,
) -> ShardManifest:
    shards = [
        Shard(
            name=entry.name,
            size=entry.size,
            etag=entry.sha256,
            samples=rows[index] if rows is not None else None,
        )
        for index, entry in enumerate(body.shards)
    ]
    return ShardManifest(
        uri=shard_prefix(owner_id),
        format=body.format,
        dtype=dtype,
        columns=columns,
        shards=sorted(shards, key=lambda shard: shard.name),
    )


async def create_shard_dataset(
    session: AsyncSession, store: ArtifactStore, owner_id: str, body: ShardDatasetCreate
) -> tuple[StoredDataset, bool]:
    """(the dataset, created): the owner's dataset of these shards (200), or a new one (201).
    422 naming each shard at fault (not stored, another size, not the format's ending, not
    parquet) or the field (dtype, columns)."""
    dtype = (body.dtype or "uint16") if body.format == "tokens" else body.dtype
    problems = format_field_problems(body.format, body.dtype, body.columns, body.records)
    problems += await run_in_threadpool(
        _entry_problems, body, dtype if body.format == "tokens" else None
    )
    if not problems:
        problems = await _storage_problems(session, owner_id, body)
    if problems:
        raise _refuse(problems)
    columns: dict[str, str] | None = None
    rows = None
    if body.format == "parquet":
        columns = {**DEFAULT_COLUMNS, **{str(k): v for k, v in (body.columns or {}).items()}}
        await session.commit()  # (no transaction held while the footers are read)
        rows = await run_in_threadpool(_count_rows, store, owner_id, body, columns)
        if columns == DEFAULT_COLUMNS:
            columns = None
    manifest = await run_in_threadpool(_manifest, owner_id, body, dtype, columns, rows)
    await lock_shards(session, owner_id)  # (no shard deleted from now until the commit)
    problems = await _storage_problems(session, owner_id, body)
    if problems:
        await session.rollback()
        raise _refuse(problems)
    return await save_manifest_dataset(
        session,
        owner_id,
        manifest,
        kind="shards",
        name=body.name or "shards",
        filename=body.name or "shards",
        uri=None,
        loc=["body", "shards"],
        records=body.records,
    )
