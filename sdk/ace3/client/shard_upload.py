"""Uploading a local directory of shards (``client.load_dataset(directory, format=...)``): each
file with the format's ending is hashed, the shards the service has stored already are skipped
(so an interrupted upload resumes where it stopped), the others are uploaded one by one, each
under the server's upload cap, and the dataset (kind ``shards``) is made of them.

A shard goes through the API (``POST /v1/datasets/shards/upload``) or, when the server says so
(an S3 artifact store), straight to the object store: presigned multipart, each part ``PUT`` to
its URL without the API key, then completed through the API, which checks the bytes' sha256.
When this machine cannot reach the store's URLs, the shards go through the API instead.
"""

from __future__ import annotations

import contextlib
import os
import uuid
import warnings
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, ValidationError

from ace3.client._http import make_status_error
from ace3.client.types import Dataset
from ace3.config.shards import SHARD_SUFFIXES, Shard, shard_suffix
from ace3.errors import APIConnectionError
from ace3.errors import ValidationError as APIValidationError
from ace3.files import CHUNK_BYTES, sha256_file

if TYPE_CHECKING:
    from ace3.client._http import HTTPClient

PATH = "/v1/datasets/shards"
#: sha256s asked about in one request (the server's limit).
QUERY_BATCH = 1000
#: Shards hashed, and uploaded, at once.
WORKERS = 4
#: Tries of one part's PUT to the object store.
PART_TRIES = 3
#: Bytes per second the server reads a direct upload back at, at least (its completion's timeout).
VERIFY_BYTES_PER_SECOND = 20 << 20


class _APIObject(BaseModel):
    model_config = ConfigDict(extra="allow")


class StoredShard(_APIObject):
    """A shard the service stored for you (its bytes, verified)."""

    sha256: str
    size_bytes: int
    created_at: datetime | None = None


class ShardCheck(_APIObject):
    missing: list[str]
    direct: bool = False


class DirectUploadPart(_APIObject):
    part_number: int
    size: int
    url: str


class DirectUpload(_APIObject):
    sha256: str
    size_bytes: int
    token: str
    upload_id: str
    part_bytes: int
    parts: list[DirectUploadPart]
    expires_in: int


@dataclass(frozen=True)
class LocalShard:
    """One shard file: its name in the dataset (its path relative to the directory)."""

    name: str
    path: Path
    size: int
    sha256: str


class _StoreUnreachable(Exception):
    """A presigned URL of the object store cannot be reached from here."""


def find_shards(source: Path, format: str) -> list[tuple[str, Path]]:
    """(name, path) of every file under ``source`` (a directory; or one file) ending in one of
    ``format``'s endings, sorted by name (the path relative to ``source``, with ``/``).
    ValueError when there is none, or a name the service cannot take."""
    endings = ", ".join(SHARD_SUFFIXES[format])
    if source.is_file():
        found = [(source.name, source)] if shard_suffix(format, source.name) else []
    else:
        found = []
        for directory, subdirectories, names in os.walk(source):
            subdirectories.sort()
            for name in names:
                path = Path(directory, name)
                if shard_suffix(format, name) is not None and path.is_file():
                    found.append((path.relative_to(source).as_posix(), path))
    if not found:
        raise ValueError(f"{source} holds no {format} shards (files ending in {endings})")
    for name, path in found:
        try:
            Shard(name=name, size=0, etag="")
        except ValidationError as exc:
            reason = exc.errors()[0]["msg"].removeprefix("Value error, ")
            raise ValueError(f"cannot upload {path} as a shard: {reason}") from None
    return sorted(found)


def hash_shards(found: list[tuple[str, Path]]) -> list[LocalShard]:
    def one(item: tuple[str, Path]) -> LocalShard:
        name, path = item
        return LocalShard(name, path, path.stat().st_size, sha256_file(path))

    with ThreadPoolExecutor(WORKERS, thread_name_prefix="ace3-hash") as pool:
        return list(pool.map(one, found))


def _batches(values: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(values), QUERY_BATCH):
        yield values[start : start + QUERY_BATCH]


class ShardUploader:
    """The uploads of one directory's shards over one client connection."""

    def __init__(self, http: HTTPClient, upload: Any) -> None:
        self._http = http
        self._upload_file = upload  # resources._upload bound to client.datasets
        self.direct = False
        self.uploaded: list[str] = []  # the names uploaded, in the order they finished

    def missing(self, shards: list[LocalShard]) -> set[str]:
        """The sha256s of ``shards`` the service has not stored; sets :attr:`direct`."""
        digests = list(dict.fromkeys(shard.sha256 for shard in shards))
        missing: set[str] = set()
        for batch in _batches(digests):
            response = self._http.request(
                "POST", f"{PATH}/missing", json_body={"sha256": batch}, idempotent=True
            )
            check = ShardCheck.model_validate(response.json())
            missing.update(check.missing)
            self.direct = check.direct
        return missing

    def upload_all(self, shards: list[LocalShard]) -> None:
        """Upload each shard (distinct bytes once), ``WORKERS`` at a time."""
        unique = list({shard.sha256: shard for shard in shards}.values())
        with ThreadPoolExecutor(WORKERS, thread_name_prefix="ace3-upload") as pool:
            for _ in pool.map(self.upload, unique):
                pass

    def upload(self, shard: LocalShard) -> None:
        if self.direct and shard.size > 0:
            try:
                self._direct(shard)
            except _StoreUnreachable as exc:
                if self.direct:
                    self.direct = False
                    warnings.warn(
                        f"the object store's upload URLs cannot be reached from here ({exc}): "
                        "the shards go through the API instead (an administrator sets "
                        "ACE3_S3_PUBLIC_ENDPOINT_URL to an address clients reach)",
                        stacklevel=2,
                    )
                self._through_api(shard)
        else:
            self._through_api(shard)
        self.uploaded.append(shard.name)

    def _through_api(self, shard: LocalShard) -> StoredShard:
        payload = self._upload_file(
            f"{PATH}/upload", shard.path, shard.path.name, {"sha256": shard.sha256}, None
        )
        return StoredShard.model_validate(payload)

    def _direct(self, shard: LocalShard) -> StoredShard:
        response = self._http.request(
            "POST",
            f"{PATH}/direct",
            json_body={"sha256": shard.sha256, "size": shard.size},
            idempotent=True,
        )
        upload = DirectUpload.model_validate(response.json())
        try:
            etags = self._put_parts(shard, upload)
        except BaseException:
            self._abort(upload)
            raise
        verify = max(60.0, shard.size / VERIFY_BYTES_PER_SECOND)
        response = self._http.request(
            "POST",
            f"{PATH}/direct/complete",
            json_body={
                "sha256": shard.sha256,
                "size": shard.size,
                "token": upload.token,
                "upload_id": upload.upload_id,
                "etags": etags,
            },
            idempotent=True,
            timeout=httpx.Timeout(60.0, read=verify),
        )
        return StoredShard.model_validate(response.json())

    def _abort(self, upload: DirectUpload) -> None:
        # (best effort: a store forgets incomplete uploads by its own rules too)
        with contextlib.suppress(Exception):
            self._http.request(
                "POST",
                f"{PATH}/direct/abort",
                json_body={"token": upload.token, "upload_id": upload.upload_id},
                idempotent=True,
            )

    def _put_parts(self, shard: LocalShard, upload: DirectUpload) -> list[str]:
        """PUT each part's bytes to its presigned URL (never with the API key): their ETags."""
        etags = []
        with (
            httpx.Client(timeout=self._http.timeout, transport=self._http._transport) as plain,
            shard.path.open("rb") as handle,
        ):
            for part in upload.parts:
                handle.seek((part.part_number - 1) * upload.part_bytes)
                data = _read_exactly(handle, part.size, shard.path)
                etags.append(self._put_part(plain, part, data))
        return etags

    def _put_part(self, plain: httpx.Client, part: DirectUploadPart, data: bytes) -> str:
        for attempt in range(1, PART_TRIES + 1):
            try:
                response = plain.put(part.url, content=data)
            except httpx.ConnectError as exc:
                raise _StoreUnreachable(str(exc) or type(exc).__name__) from exc
            except httpx.TransportError as exc:
                if attempt == PART_TRIES:
                    raise APIConnectionError(
                        f"could not upload a shard part to the object store: {exc}",
                        request=exc.request,
                    ) from exc
                continue
            if response.is_success and response.headers.get("etag"):
                return str(response.headers["etag"])
            if response.status_code < 500 or attempt == PART_TRIES:
                raise make_status_error(response)
        raise AssertionError("unreachable")  # pragma: no cover

    def create(self, shards: list[LocalShard], body: Mapping[str, Any]) -> tuple[Dataset, bool]:
        entries = [{"name": s.name, "sha256": s.sha256, "size": s.size} for s in shards]
        response = self._http.request(
            "POST",
            PATH,
            json_body={**{k: v for k, v in body.items() if v is not None}, "shards": entries},
            idempotency_key=str(uuid.uuid4()),
            timeout=httpx.Timeout(60.0, read=max(60.0, len(shards) / 100)),
        )
        return Dataset.model_validate(response.json()), response.status_code == 201


def _read_exactly(handle: Any, size: int, path: Path) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = handle.read(min(CHUNK_BYTES * 8, size - len(data)))
        if not chunk:
            raise ValueError(f"{path} changed while it was uploaded (it is shorter now)")
        data += chunk
    return bytes(data)


def _not_stored(error: APIValidationError) -> bool:
    return bool(error.errors) and all(e.get("type") == "shard_not_stored" for e in error.errors)


def upload_shard_directory(
    http: HTTPClient,
    upload: Any,
    source: Path,
    *,
    format: str,
    name: str | None,
    dtype: str | None,
    columns: Mapping[Literal["inputs", "targets"], str] | None,
    records: str | None = None,
) -> tuple[Dataset, bool, ShardUploader]:
    """Upload what the service lacks of ``source``'s shards and make the dataset of them:
    (the dataset, whether it is new, the uploader: which shards it uploaded)."""
    shards = hash_shards(find_shards(source, format))
    body = {
        "format": format,
        "name": name or source.resolve().name,
        "dtype": dtype,
        "columns": dict(columns) if columns is not None else None,
        "records": records,
    }
    uploader = ShardUploader(http, upload)
    for attempt in range(2):
        missing = uploader.missing(shards)
        uploader.upload_all([shard for shard in shards if shard.sha256 in missing])
        try:
            dataset, created = uploader.create(shards, body)
        except APIValidationError as exc:
            # (a shard deleted meanwhile, with the last dataset that named it: upload it again)
            if attempt == 0 and _not_stored(exc):
                continue
            raise
        return dataset, created, uploader
    raise AssertionError("unreachable")  # pragma: no cover
