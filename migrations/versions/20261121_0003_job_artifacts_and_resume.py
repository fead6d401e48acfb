"""job artifacts, and jobs that start from a stored checkpoint

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21 09:12:03.512210
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "job_artifacts",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("path", sa.String(length=1024), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("storage_key", sa.String(length=500), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id", "path", name="uq_job_artifacts_job_path"),
    )
    op.create_index(op.f("ix_job_artifacts_job_id"), "job_artifacts", ["job_id"], unique=False)
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("resume_from_checkpoint_id", sa.String(length=32), nullable=True)
        )
        batch_op.create_foreign_key(
            "fk_jobs_resume_from_checkpoint_id",
            "job_checkpoints",
            ["resume_from_checkpoint_id"],
            ["id"],
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_constraint("fk_jobs_resume_from_checkpoint_id", type_="foreignkey")
        batch_op.drop_column("resume_from_checkpoint_id")
    op.drop_index(op.f("ix_job_artifacts_job_id"), table_name="job_artifacts")
    op.drop_table("job_artifacts")
