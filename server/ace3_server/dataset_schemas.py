"""Request and response bodies of datasets (``/v1/datasets``): a stored dataset, and what a
sharded one is made with (registered from a bucket prefix, or of uploaded shards:
:mod:`ace3_server.shard_schemas`)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import AliasPath, BaseModel, ConfigDict, Field

from ace3.config.shards import StreamFormat, TokenDtype
from ace3.config.text_records import RecordKind
from ace3_server.api.params import StoredText


class DatasetOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    name: str
    filename: str
    kind: str = Field(
        description="file or directory (uploaded), remote (registered from a bucket prefix) or "
        "shards (uploaded shard by shard)."
    )
    format: str = Field(
        description="An uploaded file's (pt, npz, csv, jsonl), 'directory', or a sharded "
        "dataset's stream format (webdataset, parquet, jsonl, tokens)."
    )
    sha256: str = Field(
        description="The bytes' sha256; for a sharded dataset, its shard manifest's digest."
    )
    size_bytes: int = Field(description="Bytes; for a sharded dataset, all shards' bytes.")
    uri: str | None = Field(
        None, description="A remote dataset's source, s3://bucket/prefix/ (None otherwise)."
    )
    shard_count: int | None = Field(None, description="A sharded dataset's shards.")
    samples: int | None = Field(
        None,
        description="A sharded dataset's samples, when the format records them (parquet rows); "
        "None when unknown (jsonl, webdataset; tokens: they depend on sequence_length).",
    )
    records: str | None = Field(
        None,
        validation_alias=AliasPath("batch_layout", "records"),
        description="The kind of its text records (chat, prompt_completion, text): named with "
        "records=, or told by an uploaded .jsonl file's first record; null: none known.",
    )
    created_at: datetime


class ShardedDatasetFields(BaseModel):
    """What a sharded dataset is made with, registered from a bucket or from uploaded shards:
    the shards' format, its name and the format's options."""

    model_config = ConfigDict(extra="forbid")

    format: StreamFormat = Field(
        ...,
        description="The shards' format: webdataset (.tar), parquet, jsonl (.jsonl, .jsonl.gz, "
        ".jsonl.zst) or tokens (.bin).",
    )
    name: StoredText | None = Field(None, max_length=200)
    dtype: TokenDtype | None = Field(None, description="tokens only: the ids' type (uint16).")
    columns: (
        dict[Literal["inputs", "targets"], Annotated[StoredText, Field(max_length=200)]] | None
    ) = Field(
        None,
        description="parquet only: the columns read as inputs and targets (default the same "
        "names).",
    )
    records: RecordKind | None = Field(
        None,
        description="jsonl only: the kind of the shards' text records (chat, "
        "prompt_completion, text), for a Hugging Face model.",
    )


class DatasetRegister(ShardedDatasetFields):
    """A dataset by reference: the shards under an s3:// prefix the service may read."""

    uri: StoredText = Field(
        ...,
        min_length=6,
        max_length=999,
        description="s3://bucket/prefix/: under one of the service's ACE3_DATASET_SOURCES.",
    )
