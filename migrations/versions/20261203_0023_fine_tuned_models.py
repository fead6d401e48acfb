"""Fine-tuned models: jobs.fine_tuned_model_id, jobs.fine_tune_request, models.source_job_id

A job whose run exports a Hugging Face model directory (``artifacts/huggingface/``) registers
that directory as a new model of its owner when it succeeds; the job row names it
(``fine_tuned_model_id``, written in the same transaction as ``succeeded``) and the model row
names the job it came from (``source_job_id``). ``fine_tune_request`` keeps what a job created
through the OpenAI-compatible API was asked for (suffix, method, hyperparameters, metadata), which
that API shows back. All nullable: other jobs, and rows stored before this revision, have none.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-03 09:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FOREIGN_KEY = "fk_jobs_fine_tuned_model_id_models"


def upgrade() -> None:
    # Plain ADD COLUMNs: on SQLite a batch operation that adds a constraint recreates the table,
    # which drops its triggers (migration 0012's webhook outbox). SQLite cannot add a foreign key
    # to an existing table, so there the column has none (SQLite enforces none by default).
    op.add_column("jobs", sa.Column("fine_tuned_model_id", sa.String(32), nullable=True))
    op.add_column("jobs", sa.Column("fine_tune_request", sa.JSON(), nullable=True))
    if op.get_bind().dialect.name != "sqlite":
        op.create_foreign_key(FOREIGN_KEY, "jobs", "models", ["fine_tuned_model_id"], ["id"])
    op.add_column("models", sa.Column("source_job_id", sa.String(32), nullable=True))


def downgrade() -> None:
    # (plain DROP COLUMNs for the same reason: SQLite 3.35+ drops a column in place)
    op.drop_column("models", "source_job_id")
    if op.get_bind().dialect.name != "sqlite":
        op.drop_constraint(FOREIGN_KEY, "jobs", type_="foreignkey")
    op.drop_column("jobs", "fine_tune_request")
    op.drop_column("jobs", "fine_tuned_model_id")
