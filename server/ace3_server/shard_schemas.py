"""Request and response bodies of uploaded shard directories (``/v1/datasets/shards...``): the
shards an owner stored (by sha256), their uploads (through the API, or presigned multipart
straight to an S3 store), and the dataset made of them (kind ``shards``)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from ace3_control.dataset_sources import MAX_SHARDS
from ace3_server.api.params import StoredText
from ace3_server.dataset_schemas import ShardedDatasetFields
from ace3_server.storable import INT64_MAX

Sha256 = Annotated[
    str, Field(pattern="^[0-9a-f]{64}$", description="The shard's sha256, lowercase hex.")
]
Token = Annotated[
    str, Field(pattern="^[0-9a-f]{32}$", description="The upload's token, from its start.")
]
UploadId = Annotated[StoredText, Field(min_length=1, max_length=1024)]
#: Shards one query may ask about.
MAX_QUERY = 1000
#: Parts one presigned upload may have (S3's limit).
MAX_PARTS = 10_000
#: The longest shard name (a path in the uploaded directory).
MAX_SHARD_NAME = 256


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StoredShardOut(BaseModel):
    """A shard this owner stored: its bytes are in the artifact store, verified."""

    model_config = ConfigDict(from_attributes=True)

    sha256: str
    size_bytes: int
    created_at: datetime


class ShardQuery(_Strict):
    """Which of these shards are not stored yet."""

    sha256: list[Sha256] = Field(min_length=1, max_length=MAX_QUERY)


class ShardCheckOut(BaseModel):
    missing: list[str] = Field(
        description="The asked sha256s this owner has not stored, in the order asked."
    )
    direct: bool = Field(
        description="Whether shards are uploaded straight to the object store (POST "
        "/v1/datasets/shards/direct: presigned multipart) rather than through the API (POST "
        "/v1/datasets/shards/upload)."
    )


class DirectUploadStart(_Strict):
    sha256: Sha256
    size: int = Field(ge=1, le=INT64_MAX, description="The shard's bytes.")


class DirectUploadPart(BaseModel):
    part_number: int
    size: int = Field(description="The part's bytes: the PUT must carry exactly these.")
    url: str = Field(description="A presigned PUT URL of the object store (no API key).")


class DirectUploadOut(BaseModel):
    """A presigned multipart upload of one shard: PUT each part's bytes to its URL (the
    response's ETag header is the part's etag), then complete it (or abort it)."""

    sha256: str
    size_bytes: int
    token: str = Field(description="Names this upload when completing or aborting it.")
    upload_id: str
    part_bytes: int = Field(description="Every part's size but the last one's.")
    parts: list[DirectUploadPart]
    expires_in: int = Field(description="Seconds the part URLs stay valid.")


class DirectUploadComplete(_Strict):
    sha256: Sha256
    size: int = Field(ge=1, le=INT64_MAX)
    token: Token
    upload_id: UploadId
    etags: list[Annotated[StoredText, Field(min_length=1, max_length=200)]] = Field(
        min_length=1,
        max_length=MAX_PARTS,
        description="Each part's ETag as the store answered its PUT, part 1 first.",
    )


class DirectUploadAbort(_Strict):
    token: Token
    upload_id: UploadId


class ShardEntry(_Strict):
    name: StoredText = Field(
        min_length=1,
        max_length=MAX_SHARD_NAME,
        description="The shard's path relative to the directory (e.g. 'train/000.parquet').",
    )
    sha256: Sha256
    size: int = Field(ge=0, le=INT64_MAX)


class ShardDatasetCreate(ShardedDatasetFields):
    """A dataset of shards this owner stored (uploaded shard by shard)."""

    shards: list[ShardEntry] = Field(min_length=1, max_length=MAX_SHARDS)
