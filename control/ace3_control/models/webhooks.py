"""Webhooks, the events they are sent, and each delivery's state."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column

from ace3_control.models.base import Base, new_id, utcnow
from ace3_control.models.states import DeliveryState


class Webhook(Base):
    """A URL an owner asked ACE3 to POST its job and search state changes to, signed with
    ``secret`` (HMAC-SHA256; shown to the owner once, at creation)."""

    __tablename__ = "webhooks"
    __table_args__ = (Index("ix_webhooks_owner_created", "owner_id", "created_at", "id"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    owner_id: Mapped[str] = mapped_column(ForeignKey("owners.id", ondelete="CASCADE"))
    url: Mapped[str] = mapped_column(String(2048))
    # Event names (``job.succeeded``) and wildcards (``job.*``) this webhook subscribes to.
    events: Mapped[list[str]] = mapped_column(JSON)
    secret: Mapped[str] = mapped_column(String(100))
    disabled: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class WebhookEvent(Base):
    """The outbox: one row per job or search state change of an owner who has a webhook.

    Written by database triggers on ``jobs`` and ``searches`` (migration 0012) in the same
    transaction as the state change, whichever process makes it; the API's delivery loop turns
    each row into one ``webhook_deliveries`` row per subscribed webhook and deletes it."""

    __tablename__ = "webhook_events"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    owner_id: Mapped[str] = mapped_column(String(32))
    kind: Mapped[str] = mapped_column(String(16))  # "job" or "search"
    subject_id: Mapped[str] = mapped_column(String(32))
    state: Mapped[str] = mapped_column(String(16))
    previous_state: Mapped[str | None] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class WebhookDelivery(Base):
    """One event for one webhook, and every attempt to POST it (``history``)."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        Index("ix_webhook_deliveries_webhook_created", "webhook_id", "created_at", "id"),
        Index("ix_webhook_deliveries_state_next", "state", "next_attempt_at"),
    )

    # Also the body's ``id``: the same on every retry, so receivers can drop duplicates.
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    webhook_id: Mapped[str] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"))
    owner_id: Mapped[str] = mapped_column(String(32))
    event_type: Mapped[str] = mapped_column(String(64))
    payload: Mapped[dict[str, Any]]
    state: Mapped[str] = mapped_column(String(16), default=DeliveryState.PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_status_code: Mapped[int | None] = mapped_column(Integer, default=None)
    last_error: Mapped[str | None] = mapped_column(Text, default=None)
    last_duration_ms: Mapped[float | None] = mapped_column(Float, default=None)
    # One entry per attempt: {"at", "status_code", "error", "duration_ms"}.
    history: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(default=None)
