"""fair_queue: owner quotas, job priority, retention bookkeeping

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26 09:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("owners", sa.Column("max_running_jobs", sa.Integer(), nullable=True))
    op.add_column("owners", sa.Column("max_gpus", sa.Integer(), nullable=True))
    op.add_column("owners", sa.Column("max_priority", sa.String(length=8), nullable=True))
    op.add_column("owners", sa.Column("last_claimed_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column(
        "jobs",
        sa.Column("priority", sa.String(length=8), nullable=False, server_default="normal"),
    )
    op.add_column("jobs", sa.Column("logs_archived_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("jobs", sa.Column("metrics_pruned_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_jobs_state_owner", "jobs", ["state", "owner_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_jobs_state_owner", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("metrics_pruned_at")
        batch.drop_column("logs_archived_at")
        batch.drop_column("priority")
    with op.batch_alter_table("owners") as batch:
        batch.drop_column("last_claimed_at")
        batch.drop_column("max_priority")
        batch.drop_column("max_gpus")
        batch.drop_column("max_running_jobs")
