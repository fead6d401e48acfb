"""environments: per-job Python environments built once per cluster (issue 28)

``environments``: one row per environment (its hash: the normalised requirements, the Python
version, the platform and the worker's installed set), also the build's lock (``builder``,
``lease_expires_at``). ``jobs.requirements`` (the merged, normalised list), ``jobs.environment_hash``
and ``jobs.phase`` ("preparing_environment" while a starting job's environment is prepared);
``models.requirements`` (a package's requirements.txt); ``workers.packages`` (the installed set a
worker advertises, so that the API refuses a requirement that would replace one).

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-29 03:20:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "environments",
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("requirements", sa.JSON(), nullable=False),
        sa.Column("python", sa.String(length=32), nullable=False),
        sa.Column("platform", sa.String(length=64), nullable=False),
        sa.Column("constraints_sha256", sa.String(length=64), nullable=False),
        sa.Column("packages", sa.JSON(), nullable=True),
        sa.Column("builder", sa.String(length=200), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("storage_key", sa.String(length=500), nullable=True),
        sa.Column("sha256", sa.String(length=64), nullable=True),
        sa.Column("archive_bytes", sa.BigInteger(), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("build_seconds", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ready_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("hash"),
    )
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("requirements", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("environment_hash", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("phase", sa.String(length=32), nullable=True))
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("requirements", sa.JSON(), nullable=True))
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("packages", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("packages")
    with op.batch_alter_table("models") as batch:
        batch.drop_column("requirements")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("phase")
        batch.drop_column("environment_hash")
        batch.drop_column("requirements")
    op.drop_table("environments")
