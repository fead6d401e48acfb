"""What owners upload: models, datasets and checkpoints to start jobs from."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    ForeignKey,
    Integer,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from ace3_control.models.base import Base, new_id, utcnow
from ace3_control.storage.base import is_tree_key


class StoredModel(Base):
    """Uploaded model code: a .py file or an archive of a package (kind "file", "archive"), or
    a Hugging Face model directory (kind "huggingface": a tree like a package's, built with
    from_pretrained, no entry module). Stored once per owner."""

    __tablename__ = "models"
    __table_args__ = (
        UniqueConstraint("owner_id", "sha256", "variant", name="uq_models_owner_sha256_variant"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    owner_id: Mapped[str] = mapped_column(ForeignKey("owners.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    filename: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(16))
    entry_module: Mapped[str | None] = mapped_column(String(200))
    factory: Mapped[str] = mapped_column(String(200))
    # The same bytes used through another factory or entry module are another model.
    variant: Mapped[str] = mapped_column(String(401))
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    storage_key: Mapped[str] = mapped_column(String(500))
    # A package's tree digest (ace3_control.storage.trees): what its fetch is checked against.
    tree_sha256: Mapped[str | None] = mapped_column(String(64), default=None)
    # A package's requirements.txt, read at upload (ace3.config.requirements); None: none.
    requirements: Mapped[list[str] | None] = mapped_column(JSON, default=None)
    # What the built model's forward takes, read from the source at upload where certain
    # (ace3_server.upload_checks.model_forward); None: unknown, or compute_loss feeds it.
    forward_signature: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    # A Hugging Face model directory's (kind "huggingface"; None for the other kinds), read at
    # upload from config.json and the safetensors headers (ace3_control.hf_model_dir):
    # config.json's architectures (None when it names none), the parameters the weights hold,
    # the modules that own them (tensor names less their last component, sorted), and
    # {model_type, max_position_embeddings, has_tokenizer, has_chat_template}.
    architectures: Mapped[list[str] | None] = mapped_column(JSON, default=None)
    parameter_count: Mapped[int | None] = mapped_column(BigInteger, default=None)
    module_names: Mapped[list[str] | None] = mapped_column(JSON, default=None)
    hf_config: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    # The job whose export this model is (a fine-tuned model); None: uploaded.
    source_job_id: Mapped[str | None] = mapped_column(String(32), default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    deleted_at: Mapped[datetime | None] = mapped_column(default=None)


class StoredDataset(Base):
    """A dataset: an uploaded file, a directory (extracted from the uploaded archive), or a
    sharded one: registered from a bucket prefix (``kind="remote"``, ``storage_key`` its uri;
    deleting it never touches the bucket) or uploaded shard by shard (``kind="shards"``). A
    sharded dataset's ``manifest`` is its ``ace3.config.shards.ShardManifest`` as JSON, its
    ``sha256`` the manifest's digest, ``format`` the stream format, ``size_bytes`` all shards'
    bytes, ``samples`` their sample count when every shard's is known."""

    __tablename__ = "datasets"
    __table_args__ = (UniqueConstraint("owner_id", "sha256", name="uq_datasets_owner_sha256"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    owner_id: Mapped[str] = mapped_column(ForeignKey("owners.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    filename: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(16))
    format: Mapped[str] = mapped_column(String(32))
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    storage_key: Mapped[str] = mapped_column(String(1000))
    # A directory's tree digest (ace3_control.storage.trees): what its fetch is checked against.
    tree_sha256: Mapped[str | None] = mapped_column(String(64), default=None)
    uri: Mapped[str | None] = mapped_column(String(1000), default=None)
    # (deferred: up to MAX_MANIFEST_BYTES; loaded only where it is read, not by list and get)
    manifest: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None, deferred=True)
    shard_count: Mapped[int | None] = mapped_column(Integer, default=None)
    samples: Mapped[int | None] = mapped_column(BigInteger, default=None)
    # The engine's batches: {"kind": "pair"} ((inputs, targets)) or {"kind": "dict", "keys":
    # [...]}; None where the data decides (a dataset.py, WebDataset members) or before 0021.
    batch_layout: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    deleted_at: Mapped[datetime | None] = mapped_column(default=None)


class StoredShard(Base):
    """One shard of an uploaded shard directory, stored once per owner by content: its bytes are
    the artifact store's object ``datasets/<owner>/shards/<sha256>``, verified (sha256 and size)
    before this row exists, so a row means a usable shard. Datasets of kind "shards" name their
    shards by sha256 (the manifest's ``etag``); a shard no live dataset of its owner names any
    more is deleted with the last dataset that named it."""

    __tablename__ = "dataset_shards"

    owner_id: Mapped[str] = mapped_column(
        ForeignKey("owners.id", ondelete="CASCADE"), primary_key=True
    )
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class UploadedCheckpoint(Base):
    """Model weights uploaded from the caller's machine (a safetensors file, checked to hold
    only tensors), to start jobs from (``init_from``). Stored once per owner."""

    __tablename__ = "uploaded_checkpoints"
    __table_args__ = (
        UniqueConstraint("owner_id", "sha256", name="uq_uploaded_checkpoints_owner_sha256"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    owner_id: Mapped[str] = mapped_column(ForeignKey("owners.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    filename: Mapped[str] = mapped_column(String(255))
    tensors: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    storage_key: Mapped[str] = mapped_column(String(500))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    deleted_at: Mapped[datetime | None] = mapped_column(default=None)


def fetch_sha256(row: StoredModel | StoredDataset) -> str | None:
    """What a fetch of the row's stored bytes is checked against (``ArtifactStore.fetch``): a
    file's sha256, or for a tree (an extracted archive, its key ending ``/tree``) the digest of
    the tree the API stored; None for a tree stored before digests were recorded."""
    return row.tree_sha256 if is_tree_key(row.storage_key) else row.sha256
