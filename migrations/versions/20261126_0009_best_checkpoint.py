"""best_checkpoint: a job's checkpoints carry their monitored value and the best one's flag

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26 05:40:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("job_checkpoints", sa.Column("monitor_value", sa.Float(), nullable=True))
    op.add_column(
        "job_checkpoints",
        sa.Column("best", sa.Boolean(), nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    op.drop_column("job_checkpoints", "best")
    op.drop_column("job_checkpoints", "monitor_value")
