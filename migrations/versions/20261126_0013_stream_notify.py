"""stream_notify: NOTIFY ace3_stream, '<job id>' when a job's streamed rows change (Postgres)

A live event stream waits for these notifications instead of polling (one LISTEN connection
per API process, ace3_server.services.stream_wake). The payload is only the job id: a
notification is a hint, the stream re-reads the rows. Inserts into job_metrics, job_logs and
job_records notify once per statement and job (a transition table), an update of a job's
streamed state columns (the stream's ``state`` event) once per row. SQLite: nothing (it polls).

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26 09:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CHANNEL = "ace3_stream"
ROW_TABLES = ("job_metrics", "job_logs", "job_records")
STATE_COLUMNS = ("state", "attempt", "cancel_requested", "exit_code", "error")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        f"""
        CREATE FUNCTION ace3_notify_stream_rows() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('{CHANNEL}', job_id)
            FROM (SELECT DISTINCT job_id FROM new_rows) AS jobs;
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        f"""
        CREATE FUNCTION ace3_notify_stream_job() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('{CHANNEL}', NEW.id);
            RETURN NULL;
        END $$
        """
    )
    for table in ROW_TABLES:
        op.execute(
            f"CREATE TRIGGER {table}_notify_stream AFTER INSERT ON {table} "
            "REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT "
            "EXECUTE FUNCTION ace3_notify_stream_rows()"
        )
    changed = " OR ".join(f"OLD.{column} IS DISTINCT FROM NEW.{column}" for column in STATE_COLUMNS)
    op.execute(
        "CREATE TRIGGER jobs_notify_stream AFTER UPDATE ON jobs FOR EACH ROW WHEN "
        f"({changed} OR OLD.plan::text IS DISTINCT FROM NEW.plan::text) "
        "EXECUTE FUNCTION ace3_notify_stream_job()"
    )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER IF EXISTS jobs_notify_stream ON jobs")
    for table in ROW_TABLES:
        op.execute(f"DROP TRIGGER IF EXISTS {table}_notify_stream ON {table}")
    op.execute("DROP FUNCTION IF EXISTS ace3_notify_stream_job()")
    op.execute("DROP FUNCTION IF EXISTS ace3_notify_stream_rows()")
