"""uploaded_checkpoints: model weights uploaded to start jobs from (init_from)

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26 01:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "uploaded_checkpoints",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("owner_id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("filename", sa.String(length=255), nullable=False),
        sa.Column("tensors", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("storage_key", sa.String(length=500), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["owner_id"], ["owners.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("owner_id", "sha256", name="uq_uploaded_checkpoints_owner_sha256"),
    )
    op.create_index(
        op.f("ix_uploaded_checkpoints_owner_id"), "uploaded_checkpoints", ["owner_id"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_uploaded_checkpoints_owner_id"), table_name="uploaded_checkpoints")
    op.drop_table("uploaded_checkpoints")
