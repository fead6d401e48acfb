"""jobs.plan: the run plan of the newest attempt's start record (total steps, epochs, ...)

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25 12:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("plan", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "plan")
