"""Request and response bodies of ``/v1/webhooks``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ace3_server.api.params import StoredText
from ace3_server.webhooks.events import SUBSCRIBABLE
from ace3_server.webhooks.urls import MAX_URL_LENGTH

MAX_EVENTS = len(SUBSCRIBABLE)


class WebhookCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: StoredText = Field(
        min_length=1,
        max_length=MAX_URL_LENGTH,
        description="Where to POST: http(s), no user:password@; public addresses only unless "
        "the server sets ACE3_WEBHOOK_ALLOW_PRIVATE_NETWORKS.",
    )
    events: list[StoredText] = Field(
        min_length=1,
        max_length=MAX_EVENTS,
        description="Event names (job.succeeded, search.failed, ...) or wildcards "
        "(job.*, search.*, *).",
    )


class WebhookOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    url: str
    events: list[str]
    disabled: bool
    created_at: datetime


class WebhookCreated(WebhookOut):
    secret: str = Field(
        description="The HMAC-SHA256 signing secret: shown only in this response; store it."
    )


class DeliveryAttemptOut(BaseModel):
    attempt: int
    at: datetime
    status_code: int | None = None
    error: str | None = None
    duration_ms: float | None = None


class WebhookDeliveryOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    webhook_id: str
    event_type: str
    payload: dict[str, Any]
    state: str = Field(description="pending, delivered or failed (no retries left).")
    attempts: int
    next_attempt_at: datetime | None
    last_status_code: int | None
    last_error: str | None
    last_duration_ms: float | None
    history: list[DeliveryAttemptOut]
    created_at: datetime
    delivered_at: datetime | None
