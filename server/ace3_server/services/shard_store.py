"""The shards of uploaded shard directories: stored once per owner by content, uploaded through
the API or, on an S3 store, straight to the store by presigned multipart.

A shard's bytes are the store's object ``datasets/<owner>/shards/<sha256>`` (:func:`shard_key`)
and a :class:`~ace3_control.models.StoredShard` row says they are there, verified: the row is
written only after the bytes' sha256 and size were checked, and the object at the final key is
only ever written from verified bytes (an upload through the API is hashed while it is staged; a
direct upload lands under ``uploads/shards/<owner>/<token>`` and is read back and hashed by the
API before it is copied inside the store to its final key). Only the upload's bytes skip the
API; the API reads them once from the store to verify them.

Placing a shard (object, then row) and deleting the shards no dataset names any more (rows,
then objects) hold a per-owner lock (a transaction-scoped advisory lock on Postgres), as does
creating a dataset of them (:mod:`ace3_server.services.shard_datasets`), so a delete never takes
a shard from under an upload or a new dataset. On SQLite (one API process) there is no lock.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections.abc import Callable, Iterable
from typing import Any

from fastapi import HTTPException, UploadFile
from sqlalchemy import delete, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from starlette.concurrency import run_in_threadpool

from ace3_control.models import StoredDataset, StoredShard
from ace3_control.settings import Settings
from ace3_control.storage import ArtifactStore
from ace3_control.storage.s3 import S3ArtifactStore, UploadRefusedError
from ace3_server.errors import field_error, payload_too_large
from ace3_server.services.uploads import stage_upload
from ace3_server.shard_schemas import (
    MAX_PARTS,
    DirectUploadAbort,
    DirectUploadComplete,
    DirectUploadStart,
)

#: Seconds a direct upload's part URLs stay valid.
DIRECT_UPLOAD_SECONDS = 3600
#: Rows asked for in one IN (...) list.
LOOKUP_CHUNK = 1000


def shard_prefix(owner_id: str) -> str:
    """The store key prefix of an owner's shards: a "shards" dataset's manifest ``uri``."""
    return f"datasets/{owner_id}/shards/"


def shard_key(owner_id: str, sha256: str) -> str:
    """The store key of one stored shard: its manifest entry's ``uri`` + ``etag``."""
    return shard_prefix(owner_id) + sha256


def _incoming_key(owner_id: str, token: str) -> str:
    return f"uploads/shards/{owner_id}/{token}"


def direct_store(settings: Settings, store: ArtifactStore) -> S3ArtifactStore | None:
    """The S3 store when shards go straight to it (presigned multipart), else None."""
    if settings.s3_presigned_uploads and isinstance(store, S3ArtifactStore):
        return store
    return None


async def lock_shards(session: AsyncSession, owner_id: str) -> None:
    """Hold the owner's shard lock until the session's transaction ends (Postgres only)."""
    if session.get_bind().dialect.name != "postgresql":
        return
    digest = hashlib.sha256(f"ace3-dataset-shards:{owner_id}".encode()).digest()
    key = int.from_bytes(digest[:8], "big", signed=True)
    await session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})


def _chunks(values: list[str]) -> Iterable[list[str]]:
    for start in range(0, len(values), LOOKUP_CHUNK):
        yield values[start : start + LOOKUP_CHUNK]


async def stored_sizes(
    session: AsyncSession, owner_id: str, digests: Iterable[str]
) -> dict[str, int]:
    """sha256 -> bytes of those of ``digests`` the owner has stored."""
    found: dict[str, int] = {}
    for chunk in _chunks(sorted(set(digests))):
        rows = await session.execute(
            select(StoredShard.sha256, StoredShard.size_bytes).where(
                StoredShard.owner_id == owner_id, StoredShard.sha256.in_(chunk)
            )
        )
        found.update({sha256: size for sha256, size in rows.all()})
    return found


async def _place(
    session: AsyncSession, owner_id: str, sha256: str, size: int, place: Callable[[], None]
) -> tuple[StoredShard, bool]:
    """Put verified bytes at the shard's key (``place``) and record them, under the owner's
    lock: (the row, whether it is new). Placing again is harmless (the same bytes)."""
    await lock_shards(session, owner_id)
    await run_in_threadpool(place)
    row = await session.get(StoredShard, (owner_id, sha256))
    if row is not None:
        await session.commit()
        return row, False
    row = StoredShard(owner_id=owner_id, sha256=sha256, size_bytes=size)
    session.add(row)
    try:
        await session.commit()
    except IntegrityError:  # (stored concurrently: only without the lock, on SQLite)
        await session.rollback()
        winner = await session.get(StoredShard, (owner_id, sha256))
        if winner is None:  # pragma: no cover - the conflicting row must exist
            raise
        return winner, False
    return row, True


def _mismatch(sha256: str, size: int, found_sha256: str, found_size: int) -> HTTPException:
    return field_error(
        ["body", "sha256"],
        f"the uploaded bytes are not the shard announced: {found_size} bytes of sha256 "
        f"{found_sha256}, not {size} bytes of sha256 {sha256} (nothing was stored)",
        "shard_mismatch",
    )


async def upload_shard(
    session: AsyncSession,
    settings: Settings,
    store: ArtifactStore,
    owner_id: str,
    file: UploadFile,
    sha256: str,
) -> tuple[StoredShard, bool]:
    """One shard's bytes through the API (at most ``max_upload_bytes``: 413), stored when their
    sha256 is ``sha256`` (else 422 naming it)."""
    staged = await stage_upload(file.file, store.staging_dir(), settings.max_upload_bytes)
    incoming = _incoming_key(owner_id, secrets.token_hex(16))
    try:
        if staged.sha256 != sha256:
            raise _mismatch(sha256, staged.size_bytes, staged.sha256, staged.size_bytes)
        final = shard_key(owner_id, sha256)
        if isinstance(store, S3ArtifactStore):  # (sent before the lock; copied under it)
            await run_in_threadpool(store.put_file, incoming, staged.path)
            s3 = store
            return await _place(
                session, owner_id, sha256, staged.size_bytes, lambda: s3.copy(incoming, final)
            )
        path = staged.path
        return await _place(
            session, owner_id, sha256, staged.size_bytes, lambda: store.put_file(final, path)
        )
    finally:
        staged.discard()
        if isinstance(store, S3ArtifactStore):
            await run_in_threadpool(store.delete, incoming)


def part_sizes(size: int, part_bytes: int) -> list[int]:
    """The parts of ``size`` bytes: ``part_bytes`` each (more when that would make more than
    :data:`MAX_PARTS`), the last one the rest."""
    part = max(part_bytes, math.ceil(size / MAX_PARTS))
    return [min(part, size - start) for start in range(0, size, part)]


def _direct(settings: Settings, store: ArtifactStore) -> S3ArtifactStore:
    s3 = direct_store(settings, store)
    if s3 is None:
        raise HTTPException(
            status_code=409,
            detail="this server takes shards through the API (its artifact store is local, or "
            "ACE3_S3_PRESIGNED_UPLOADS is off): POST /v1/datasets/shards/upload",
        )
    return s3


async def start_direct_upload(
    settings: Settings, store: ArtifactStore, owner_id: str, body: DirectUploadStart
) -> dict[str, Any]:
    """A presigned multipart upload of one shard (409 when the store takes none; 413 past
    ``max_upload_bytes``)."""
    s3 = _direct(settings, store)
    if body.size > settings.max_upload_bytes:
        raise payload_too_large(settings.max_upload_bytes)
    sizes = part_sizes(body.size, settings.shard_part_bytes)
    token = secrets.token_hex(16)
    upload_id, urls = await run_in_threadpool(
        s3.start_upload, _incoming_key(owner_id, token), sizes, DIRECT_UPLOAD_SECONDS
    )
    return {
        "sha256": body.sha256,
        "size_bytes": body.size,
        "token": token,
        "upload_id": upload_id,
        "part_bytes": sizes[0],
        "parts": [
            {"part_number": number, "size": size, "url": url}
            for number, (size, url) in enumerate(zip(sizes, urls, strict=True), start=1)
        ],
        "expires_in": DIRECT_UPLOAD_SECONDS,
    }


def _hash_stored(store: ArtifactStore, key: str, limit: int) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    for chunk in store.iter_bytes(key):
        size += len(chunk)
        if size > limit:
            break
        digest.update(chunk)
    return digest.hexdigest(), size


async def complete_direct_upload(
    session: AsyncSession,
    settings: Settings,
    store: ArtifactStore,
    owner_id: str,
    body: DirectUploadComplete,
) -> tuple[StoredShard, bool]:
    """Complete a direct upload, read its object back to verify its sha256 and size, and store
    it as the owner's shard (422 naming ``sha256`` when the bytes are not the shard announced,
    ``upload_id`` when the store refuses to complete it)."""
    s3 = _direct(settings, store)
    incoming = _incoming_key(owner_id, body.token)
    try:
        await run_in_threadpool(s3.complete_upload, incoming, body.upload_id, body.etags)
    except UploadRefusedError as exc:
        row = await session.get(StoredShard, (owner_id, body.sha256))
        if row is not None:  # (a retried completion: the first one stored it)
            return row, False
        raise field_error(
            ["body", "upload_id"], f"the object store refused to complete the upload: {exc}"
        ) from None
    try:
        found, size = await run_in_threadpool(_hash_stored, s3, incoming, body.size)
        if (found, size) != (body.sha256, body.size):
            raise _mismatch(body.sha256, body.size, found, size)
        final = shard_key(owner_id, body.sha256)
        return await _place(
            session, owner_id, body.sha256, body.size, lambda: s3.copy(incoming, final)
        )
    finally:
        await run_in_threadpool(s3.delete, incoming)


async def abort_direct_upload(
    settings: Settings, store: ArtifactStore, owner_id: str, body: DirectUploadAbort
) -> None:
    s3 = _direct(settings, store)
    incoming = _incoming_key(owner_id, body.token)
    await run_in_threadpool(s3.abort_upload, incoming, body.upload_id)


async def _manifest_of(session: AsyncSession, dataset_id: str) -> dict[str, Any] | None:
    """One dataset's manifest (a deferred column, read on its own)."""
    manifest: dict[str, Any] | None = await session.scalar(
        select(StoredDataset.manifest).where(StoredDataset.id == dataset_id)
    )
    return manifest


def _etags(manifest: dict[str, Any] | None) -> set[str]:
    return {str(shard["etag"]) for shard in (manifest or {}).get("shards", [])}


async def delete_unshared_shards(
    session: AsyncSession, store: ArtifactStore, dataset: StoredDataset
) -> int:
    """After the "shards" ``dataset`` was marked deleted: delete its shards that no other live
    dataset of its owner names; how many. Their rows go first (from then on they are not
    stored), then, under the lock again, the objects of those still without a row (one uploaded
    again meanwhile keeps its object). A failure in between leaves objects no row names, which
    an upload of the same bytes overwrites."""
    owner_id = dataset.owner_id
    unshared = _etags(await _manifest_of(session, dataset.id))
    await lock_shards(session, owner_id)
    others = await session.scalars(
        select(StoredDataset.id).where(
            StoredDataset.owner_id == owner_id,
            StoredDataset.kind == "shards",
            StoredDataset.deleted_at.is_(None),
            StoredDataset.id != dataset.id,
        )
    )
    for other in others.all():  # (one manifest in memory at a time)
        if not unshared:
            break
        unshared.difference_update(_etags(await _manifest_of(session, other)))
    digests = sorted(unshared)
    for chunk in _chunks(digests):
        await session.execute(
            delete(StoredShard).where(
                StoredShard.owner_id == owner_id, StoredShard.sha256.in_(chunk)
            )
        )
    await session.commit()
    await lock_shards(session, owner_id)
    stored_again = await stored_sizes(session, owner_id, digests)
    gone = [sha256 for sha256 in digests if sha256 not in stored_again]

    def remove() -> None:
        for sha256 in gone:
            store.delete(shard_key(owner_id, sha256))

    await run_in_threadpool(remove)
    await session.commit()
    return len(gone)
