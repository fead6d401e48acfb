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


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("fine_tuned_model_id", sa.String(32), nullable=True))
        batch.add_column(sa.Column("fine_tune_request", sa.JSON(), nullable=True))
        batch.create_foreign_key(
            "fk_jobs_fine_tuned_model_id_models", "models", ["fine_tuned_model_id"], ["id"]
        )
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("source_job_id", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.drop_column("source_job_id")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_constraint("fk_jobs_fine_tuned_model_id_models", type_="foreignkey")
        batch.drop_column("fine_tune_request")
        batch.drop_column("fine_tuned_model_id")
