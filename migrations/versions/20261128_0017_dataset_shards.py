"""dataset_shards: the shards of uploaded shard directories, stored once per owner by content

A row is one shard whose bytes the artifact store holds under ``datasets/<owner>/shards/<sha256>``,
verified (sha256 and size) before the row is written. Datasets of kind "shards" (uploaded shard
by shard, issue 27) name their shards by sha256 in their manifest; uploading a directory again
skips the shards that have a row (an interrupted upload resumes).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28 21:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "dataset_shards",
        sa.Column("owner_id", sa.String(length=32), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["owner_id"], ["owners.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("owner_id", "sha256"),
    )


def downgrade() -> None:
    op.drop_table("dataset_shards")
