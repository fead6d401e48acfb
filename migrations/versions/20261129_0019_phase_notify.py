"""phase_notify: a job's phase and environment wake its live streams at once (Postgres)

``jobs_notify_stream`` (revision 0013) notified ``ace3_stream`` when a job's state columns or
plan changed; a starting job's ``phase`` ("preparing_environment") and ``environment_hash``
(revision 0018), which the stream's ``state`` event carries, reached a follower only with the
stream's safety re-read, up to 5 s later. The trigger is made again with both columns. SQLite:
nothing (it polls).

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-29 04:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BEFORE = ("state", "attempt", "cancel_requested", "exit_code", "error")
AFTER = (*BEFORE, "phase", "environment_hash")


def _trigger(columns: tuple[str, ...]) -> None:
    changed = " OR ".join(f"OLD.{column} IS DISTINCT FROM NEW.{column}" for column in columns)
    op.execute("DROP TRIGGER IF EXISTS jobs_notify_stream ON jobs")
    op.execute(
        "CREATE TRIGGER jobs_notify_stream AFTER UPDATE ON jobs FOR EACH ROW WHEN "
        f"({changed} OR OLD.plan::text IS DISTINCT FROM NEW.plan::text) "
        "EXECUTE FUNCTION ace3_notify_stream_job()"
    )


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        _trigger(AFTER)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        _trigger(BEFORE)
