"""webhooks: subscriptions, the state-change outbox (filled by triggers) and the delivery log

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26 09:00:00.000000

The triggers on ``jobs`` and ``searches`` write one ``webhook_events`` row per state change
(and per new row), in the same transaction as the change, but only while the owner has a
webhook: no code path that changes a state (API, worker, reconciler, search driver) can forget
the event, and owners without webhooks pay one index probe.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLES = {"jobs": "job", "searches": "search"}

_PG_FUNCTION = """
CREATE FUNCTION ace3_webhook_event() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.state IS NOT DISTINCT FROM OLD.state THEN
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM webhooks WHERE owner_id = NEW.owner_id AND NOT disabled) THEN
        INSERT INTO webhook_events (owner_id, kind, subject_id, state, previous_state, created_at)
        VALUES (
            NEW.owner_id, TG_ARGV[0], NEW.id, NEW.state,
            CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END, clock_timestamp()
        );
    END IF;
    RETURN NULL;
END
$$ LANGUAGE plpgsql
"""

_SQLITE_TRIGGER = """
CREATE TRIGGER {table}_webhook_event_{op} AFTER {event} ON {table}
WHEN {condition}EXISTS (SELECT 1 FROM webhooks WHERE owner_id = NEW.owner_id AND NOT disabled)
BEGIN
    INSERT INTO webhook_events (owner_id, kind, subject_id, state, previous_state, created_at)
    VALUES (NEW.owner_id, '{kind}', NEW.id, NEW.state, {previous},
            strftime('%Y-%m-%d %H:%M:%f', 'now'));
END
"""


def _create_triggers() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_PG_FUNCTION)
        for table, kind in _TABLES.items():
            op.execute(
                f"CREATE TRIGGER {table}_webhook_event AFTER INSERT OR UPDATE OF state "
                f"ON {table} FOR EACH ROW EXECUTE FUNCTION ace3_webhook_event('{kind}')"
            )
        return
    for table, kind in _TABLES.items():
        op.execute(
            _SQLITE_TRIGGER.format(
                table=table, op="insert", event="INSERT", kind=kind, condition="", previous="NULL"
            )
        )
        op.execute(
            _SQLITE_TRIGGER.format(
                table=table,
                op="update",
                event="UPDATE OF state",
                kind=kind,
                condition="OLD.state IS NOT NEW.state AND ",
                previous="OLD.state",
            )
        )


def _drop_triggers() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in _TABLES:
            op.execute(f"DROP TRIGGER IF EXISTS {table}_webhook_event ON {table}")
        op.execute("DROP FUNCTION IF EXISTS ace3_webhook_event()")
        return
    for table in _TABLES:
        for trigger_op in ("insert", "update"):
            op.execute(f"DROP TRIGGER IF EXISTS {table}_webhook_event_{trigger_op}")


def upgrade() -> None:
    op.create_table(
        "webhooks",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("owner_id", sa.String(length=32), nullable=False),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("events", sa.JSON(), nullable=False),
        sa.Column("secret", sa.String(length=100), nullable=False),
        sa.Column("disabled", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["owner_id"], ["owners.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_webhooks_owner_created", "webhooks", ["owner_id", "created_at", "id"], unique=False
    )
    op.create_table(
        "webhook_events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("owner_id", sa.String(length=32), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("subject_id", sa.String(length=32), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("previous_state", sa.String(length=16), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("webhook_id", sa.String(length=32), nullable=False),
        sa.Column("owner_id", sa.String(length=32), nullable=False),
        sa.Column("event_type", sa.String(length=64), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("last_duration_ms", sa.Float(), nullable=True),
        sa.Column("history", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["webhook_id"], ["webhooks.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "ix_webhook_deliveries_webhook_created",
        "webhook_deliveries",
        ["webhook_id", "created_at", "id"],
        unique=False,
    )
    op.create_index(
        "ix_webhook_deliveries_state_next",
        "webhook_deliveries",
        ["state", "next_attempt_at"],
        unique=False,
    )
    _create_triggers()


def downgrade() -> None:
    _drop_triggers()
    op.drop_index("ix_webhook_deliveries_state_next", table_name="webhook_deliveries")
    op.drop_index("ix_webhook_deliveries_webhook_created", table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_table("webhook_events")
    op.drop_index("ix_webhooks_owner_created", table_name="webhooks")
    op.drop_table("webhooks")
