"""worker registry, and how long a queued job has waited

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-21 12:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("hostname", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("device_kind", sa.String(length=8), nullable=False),
        sa.Column("device_count", sa.Integer(), nullable=False),
        sa.Column("slots", sa.Integer(), nullable=False),
        sa.Column("queue", sa.String(length=200), nullable=False),
        sa.Column("heartbeat_seconds", sa.Float(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_workers_last_seen_at"), "workers", ["last_seen_at"], unique=False)
    # Jobs queued before this revision have waited since they were last published.
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("queued_at", sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE jobs SET queued_at = enqueued_at")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.alter_column("queued_at", existing_type=sa.DateTime(timezone=True), nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("queued_at")
    op.drop_index(op.f("ix_workers_last_seen_at"), table_name="workers")
    op.drop_table("workers")
