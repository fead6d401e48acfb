"""Hugging Face models: models.architectures, parameter_count, module_names, hf_config

A Hugging Face model directory uploaded as a model (kind "huggingface") is described at upload
from its config.json and safetensors headers (``ace3_server.upload_checks.hf_model``): the
classes config.json names, the parameters the weights hold, the modules that own them (what
LoRA targets are checked against) and a small summary of the config and tokenizer. Nullable:
the other kinds, and rows stored before this revision, have none.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-02 09:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("architectures", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("parameter_count", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("module_names", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("hf_config", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.drop_column("hf_config")
        batch.drop_column("module_names")
        batch.drop_column("parameter_count")
        batch.drop_column("architectures")
