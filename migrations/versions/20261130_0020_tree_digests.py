"""tree digests: models.tree_sha256, datasets.tree_sha256

A model package or a dataset directory is stored as a tree (an extracted archive: a directory
in the local store, one tar object in S3); its ``sha256`` is the uploaded archive's, which a
fetched tree cannot be checked against. ``tree_sha256`` records the digest of the tree the API
stored (``ace3_control.storage.trees.tree_digest``), and the worker's fetch checks it. Nullable:
files have none, and trees stored before this revision are fetched unchecked.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-30 04:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("models", "datasets")


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("tree_sha256", sa.String(length=64), nullable=True))


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("tree_sha256")
