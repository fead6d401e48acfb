"""Creating, reading and deleting an owner's webhooks (the routes' logic)."""

from __future__ import annotations

import secrets

from fastapi import HTTPException
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from ace3_control.models import (
    DeliveryState,
    Owner,
    Webhook,
    WebhookDelivery,
    new_id,
    utcnow,
)
from ace3_control.settings import Settings
from ace3_server.errors import field_error, not_found
from ace3_server.webhooks.events import PING, SUBSCRIBABLE, unknown_events
from ace3_server.webhooks.outbox import add_delivery
from ace3_server.webhooks.schemas import WebhookCreate
from ace3_server.webhooks.urls import url_problem

SECRET_PREFIX = "whsec_"


async def create_webhook(
    session: AsyncSession, owner_id: str, body: WebhookCreate, settings: Settings
) -> Webhook:
    unknown = unknown_events(body.events)
    if unknown:
        raise field_error(
            ["body", "events"],
            f"unknown event names {unknown}: use {sorted(SUBSCRIBABLE)}",
        )
    problem = await url_problem(
        body.url,
        allow_private_networks=settings.webhook_allow_private_networks,
        dns_timeout=settings.webhook_dns_timeout_seconds,
    )
    if problem is not None:
        raise field_error(["body", "url"], f"the URL {problem}")
    # Lock the owner's row first: concurrent creates then count one after the other, so none
    # gets past the cap on a count taken before another's insert committed.
    await session.execute(select(Owner.id).where(Owner.id == owner_id).with_for_update())
    count = await session.scalar(
        select(func.count()).select_from(Webhook).where(Webhook.owner_id == owner_id)
    )
    if (count or 0) >= settings.webhook_max_per_owner:
        raise field_error(
            ["body", "url"],
            f"this owner already has {count} webhooks, the most allowed "
            "(ACE3_WEBHOOK_MAX_PER_OWNER): delete one first",
        )
    webhook = Webhook(
        id=new_id(),
        owner_id=owner_id,
        url=body.url,
        events=list(dict.fromkeys(body.events)),
        secret=SECRET_PREFIX + secrets.token_urlsafe(32),
        disabled=False,
        created_at=utcnow(),
    )
    session.add(webhook)
    await session.commit()
    return webhook


async def get_owned_webhook(session: AsyncSession, owner_id: str, webhook_id: str) -> Webhook:
    webhook = await session.get(Webhook, webhook_id)
    if webhook is None or webhook.owner_id != owner_id:
        raise not_found("webhook")
    return webhook


async def queue_ping(session: AsyncSession, owner_id: str, webhook_id: str) -> WebhookDelivery:
    """Queue a ``ping`` to the owner's webhook, unless one is still pending (409): at most one
    ping per webhook waits or retries at a time, so test calls cannot pile up deliveries."""
    webhook = await session.scalar(
        select(Webhook).where(Webhook.id == webhook_id).with_for_update()
    )
    if webhook is None or webhook.owner_id != owner_id:
        raise not_found("webhook")
    pending = await session.scalar(
        select(WebhookDelivery.id)
        .where(
            WebhookDelivery.webhook_id == webhook.id,
            WebhookDelivery.event_type == PING,
            WebhookDelivery.state == DeliveryState.PENDING,
        )
        .limit(1)
    )
    if pending is not None:
        raise HTTPException(
            status_code=409,
            detail=f"a ping to this webhook is still pending (delivery {pending}): follow it "
            "in GET /v1/webhooks/{id}/deliveries and test again once it is delivered or failed",
        )
    row = add_delivery(session, webhook, PING, {"webhook_id": webhook.id})
    await session.commit()
    return row
