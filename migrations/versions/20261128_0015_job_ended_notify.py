"""job_ended_notify: NOTIFY ace3_job_ended, '<job id>' when a job reaches a final state (Postgres)

The search driver (ace3_server.searches.driver) wakes on it to record a trial's outcome and
start the next trial at once, instead of at its next tick. Only transitions into succeeded,
failed or cancelled notify, once per row (a job ends once); the payload is only the job id.
The API process's one LISTEN connection (ace3_server.services.stream_listener) listens to it
beside ace3_stream. SQLite: nothing (the driver looks for ended trials itself).

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-28 09:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CHANNEL = "ace3_job_ended"
FINAL_STATES = ("succeeded", "failed", "cancelled")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        f"""
        CREATE FUNCTION ace3_notify_job_ended() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('{CHANNEL}', NEW.id);
            RETURN NULL;
        END $$
        """
    )
    final = ", ".join(f"'{state}'" for state in FINAL_STATES)
    op.execute(
        "CREATE TRIGGER jobs_notify_ended AFTER UPDATE ON jobs FOR EACH ROW WHEN "
        f"(OLD.state IS DISTINCT FROM NEW.state AND NEW.state IN ({final})) "
        "EXECUTE FUNCTION ace3_notify_job_ended()"
    )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER IF EXISTS jobs_notify_ended ON jobs")
    op.execute("DROP FUNCTION IF EXISTS ace3_notify_job_ended()")
