"""Sharded datasets: the manifest the service stores, and the files the engine and the worker
exchange while a job streams it. Torch-free: the API, the worker and the engine share it.

A sharded dataset is a list of shards (objects under a bucket prefix, or shard files uploaded
into the artifact store) in one ``format``. The service records each shard's name (its key
relative to the prefix), size and ETag when the dataset is registered (:class:`ShardManifest`);
the dataset's ``sha256`` is :meth:`ShardManifest.digest`.

While a job runs, the worker (outside the sandbox) fetches shards into its node-wide cache and
links each one into the job's read-only data directory under :func:`shard_file_name`; the
engine's readers say which shards they need next by writing :class:`ShardRequest` files into a
directory the job may write (:data:`REQUEST_DIR` of its output), and wait for the file to appear.
A request is a job's write, so the worker reads it as untrusted input (:func:`parse_request`).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

StreamFormat = Literal["webdataset", "parquet", "jsonl", "tokens"]
TokenDtype = Literal["uint16", "uint32"]

#: The file name endings each format's shards have (objects with other endings are not shards).
SHARD_SUFFIXES: dict[str, tuple[str, ...]] = {
    "webdataset": (".tar",),
    "parquet": (".parquet",),
    "jsonl": (".jsonl", ".jsonl.gz", ".jsonl.zst"),
    "tokens": (".bin",),
}

#: Where, in a job's output directory, the engine's readers write their request files.
REQUEST_DIR = "shard-requests"
#: The most shards one request may name, and the most bytes its file may hold (64 names of
#: ~20 bytes take about 1.3 KiB).
REQUEST_MAX_SHARDS = 64
#: The shards a reader's request names beyond the one it opens now; the worker fetches only a
#: request's first ``1 + REQUEST_LOOKAHEAD`` names.
REQUEST_LOOKAHEAD = 3
REQUEST_MAX_BYTES = 4 * 1024

_NAME = re.compile(r"^[A-Za-z0-9._=+-]+(/[A-Za-z0-9._=+-]+)*$")
_REQUEST_FILE = re.compile(r"^(train|validation)-r([0-9]{1,6})-w([0-9]{1,3})\.json$")


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Shard(_Frozen):
    """One shard as registered: where it is and what it was."""

    name: str = Field(
        min_length=1,
        max_length=1000,
        description="The object's key relative to the dataset's prefix (e.g. 'train/000.tar').",
    )
    size: int = Field(ge=0, description="Bytes, as listed at registration.")
    etag: str = Field(
        max_length=200, description="The ETag as listed, unquoted; compared as an opaque string."
    )
    samples: int | None = Field(
        None, ge=0, description="Samples in the shard, where the format records it (parquet)."
    )

    @field_validator("name")
    @classmethod
    def _relative_and_plain(cls, name: str) -> str:
        if not _NAME.match(name) or any(part in (".", "..") for part in name.split("/")):
            raise ValueError(
                f"shard name {name!r} must be a relative path of letters, digits and ._=+- "
                "(no '..', no empty parts)"
            )
        return name


class ShardManifest(_Frozen):
    """A sharded dataset: its source, format and shards, in the listing's (sorted) order."""

    uri: str = Field(
        max_length=1000,
        description="s3://bucket/prefix/ for a registered dataset; for uploaded shards, the "
        "artifact store's key prefix they were stored under.",
    )
    format: StreamFormat
    dtype: TokenDtype | None = Field(None, description="tokens: the token ids' type.")
    columns: dict[Literal["inputs", "targets"], str] | None = Field(
        None, description="parquet: the columns read as inputs and targets (default the same)."
    )
    shards: list[Shard] = Field(min_length=1)

    def digest(self) -> str:
        """The dataset's sha256: of the manifest's canonical JSON (two equal listings, one
        digest; a changed ETag or size, another)."""
        canonical = json.dumps(
            self.model_dump(mode="json"), sort_keys=True, separators=(",", ":")
        ).encode()
        return hashlib.sha256(canonical).hexdigest()

    @property
    def total_bytes(self) -> int:
        return sum(shard.size for shard in self.shards)

    @property
    def total_samples(self) -> int | None:
        """All shards' samples, or None when any shard's count is unknown."""
        counts = [shard.samples for shard in self.shards]
        return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)


def shard_suffix(format: str, name: str) -> str | None:
    """The format's ending that ``name`` has (``.jsonl.gz``), or None if it is not a shard."""
    return next((s for s in SHARD_SUFFIXES[format] if name.endswith(s)), None)


def shard_file_name(index: int, shard: Shard, format: str) -> str:
    """The shard's flat file name in a job's data directory: its index in the manifest and its
    format's ending (``000003.jsonl.gz``): unique, and no directory a job could traverse."""
    suffix = shard_suffix(format, shard.name)
    if suffix is None:
        raise ValueError(f"shard {shard.name!r} does not end in one of {SHARD_SUFFIXES[format]}")
    return f"{index:06d}{suffix}"


class ShardRequest(_Frozen):
    """What one reader (a rank's DataLoader worker, for one split) needs next: the shard file
    names it is reading or will read, in order, the one it is reading first. A shard no request
    names any more may be removed from the job's directory (the worker's cache keeps it)."""

    need: list[str] = Field(max_length=REQUEST_MAX_SHARDS)


def request_file_name(split: Literal["train", "validation"], rank: int, worker: int) -> str:
    """The request file of one reader: ``train-r0-w1.json``."""
    return f"{split}-r{rank}-w{worker}.json"


def is_request_file_name(name: str) -> bool:
    return _REQUEST_FILE.match(name) is not None


def parse_request(raw: bytes, known: set[str]) -> ShardRequest:
    """A request file's content, as the worker reads it (a job wrote it): at most
    :data:`REQUEST_MAX_BYTES`, valid JSON of :class:`ShardRequest`, each name one of the job's
    shard file names. Raises ``ValueError`` naming what is wrong."""
    if len(raw) > REQUEST_MAX_BYTES:
        raise ValueError(f"request of {len(raw)} bytes (at most {REQUEST_MAX_BYTES})")
    request = ShardRequest.model_validate_json(raw)
    unknown = [name for name in request.need if name not in known]
    if unknown:
        raise ValueError(f"request names shards the job does not have: {unknown[:3]}")
    return request
