"""batch fit: models.forward_signature, datasets.batch_layout

A job pairing a model with a dataset whose batches its ``forward`` cannot take failed seconds
into its first step. ``models.forward_signature`` records what the built model's ``forward``
takes, read from the source at upload where certain; ``datasets.batch_layout`` records the
engine's batches for the dataset ((inputs, targets) pairs, or dicts and their keys). Submission
checks one against the other (``ace3_server.services.batch_fit``). Nullable: unknown, and rows
stored before this revision, are not checked.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-01 09:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("forward_signature", sa.JSON(), nullable=True))
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(sa.Column("batch_layout", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("batch_layout")
    with op.batch_alter_table("models") as batch:
        batch.drop_column("forward_signature")
