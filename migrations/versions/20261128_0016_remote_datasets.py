"""datasets: uri, manifest, shard_count, samples (datasets by reference, issue 27)

A dataset registered from a bucket prefix (kind "remote") or uploaded shard by shard (kind
"shards") records its source URI, its shard manifest (``ace3.config.shards.ShardManifest`` as
JSON: each shard's name, size, ETag and sample count), how many shards it has, and its total
sample count when every shard's is known. All nullable: uploaded files and directories have none.
``storage_key`` widens to 1000 characters: a remote dataset's is its uri (deleting the dataset
never deletes what the uri names).

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-28 20:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(sa.Column("uri", sa.String(length=1000), nullable=True))
        batch.add_column(sa.Column("manifest", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("shard_count", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("samples", sa.BigInteger(), nullable=True))
        batch.alter_column(
            "storage_key",
            existing_type=sa.String(length=500),
            type_=sa.String(length=1000),
            existing_nullable=False,
        )


def downgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.alter_column(
            "storage_key",
            existing_type=sa.String(length=1000),
            type_=sa.String(length=500),
            existing_nullable=False,
        )
        batch.drop_column("samples")
        batch.drop_column("shard_count")
        batch.drop_column("manifest")
        batch.drop_column("uri")
