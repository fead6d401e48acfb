"""The outbox side of webhooks: each ``webhook_events`` row (written by the triggers of
migration 0012 with the state change) becomes one ``webhook_deliveries`` row per subscribed
webhook, whose body is fixed then; and old finished deliveries are forgotten."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from ace3_control.models import (
    DeliveryState,
    Job,
    Search,
    Webhook,
    WebhookDelivery,
    WebhookEvent,
    new_id,
    utcnow,
)
from ace3_control.settings import Settings
from ace3_server.webhooks import events

BATCH = 100


async def fan_out(session: AsyncSession) -> int:
    """Turn outbox rows into one delivery per subscribed webhook; returns the rows handled."""
    outbox = (
        await session.scalars(
            select(WebhookEvent)
            .order_by(WebhookEvent.id)
            .limit(BATCH)
            .with_for_update(skip_locked=True)
        )
    ).all()
    if not outbox:
        return 0
    owners = {row.owner_id for row in outbox}
    hooks: dict[str, list[Webhook]] = defaultdict(list)
    for hook in await session.scalars(
        select(Webhook).where(Webhook.owner_id.in_(owners), Webhook.disabled.is_(False))
    ):
        hooks[hook.owner_id].append(hook)
    job_ids = [row.subject_id for row in outbox if row.kind == "job"]
    search_ids = [row.subject_id for row in outbox if row.kind == "search"]
    jobs = {job.id: job for job in await session.scalars(select(Job).where(Job.id.in_(job_ids)))}
    found = await session.scalars(select(Search).where(Search.id.in_(search_ids)))
    searches = {search.id: search for search in found}
    for row in outbox:
        event_type = f"{row.kind}.{row.state}"
        if row.kind == "job":
            data = {
                "job": events.job_data(
                    jobs.get(row.subject_id), row.subject_id, row.state, row.previous_state
                )
            }
        else:
            data = {
                "search": events.search_data(
                    searches.get(row.subject_id), row.subject_id, row.state, row.previous_state
                )
            }
        for hook in hooks.get(row.owner_id, []):
            if events.subscribed(hook.events, event_type):
                add_delivery(session, hook, event_type, data, created_at=row.created_at)
    await session.execute(delete(WebhookEvent).where(WebhookEvent.id.in_([r.id for r in outbox])))
    return len(outbox)


def add_delivery(
    session: AsyncSession,
    hook: Webhook,
    event_type: str,
    data: dict[str, Any],
    created_at: datetime | None = None,
) -> WebhookDelivery:
    delivery_id = new_id()
    now = utcnow()
    # ``created_at`` is the event's time, not this fan-out's: claims go in ``created_at`` order,
    # and two API processes may fan out (and commit) a webhook's events in either order.
    delivery = WebhookDelivery(
        id=delivery_id,
        webhook_id=hook.id,
        owner_id=hook.owner_id,
        event_type=event_type,
        payload=events.body(delivery_id, event_type, created_at or now, data),
        state=DeliveryState.PENDING,
        attempts=0,
        next_attempt_at=now,
        history=[],
        created_at=created_at or now,
        updated_at=now,
    )
    session.add(delivery)
    return delivery


async def prune(session: AsyncSession, settings: Settings) -> int:
    """Forget finished deliveries older than ``ACE3_WEBHOOK_RETENTION_DAYS``."""
    before = utcnow() - timedelta(days=settings.webhook_retention_days)
    old = (
        select(WebhookDelivery.id)
        .where(
            WebhookDelivery.state != DeliveryState.PENDING,
            WebhookDelivery.updated_at < before,
        )
        .limit(1000)
    )
    ids = list((await session.scalars(old)).all())
    if ids:
        await session.execute(delete(WebhookDelivery).where(WebhookDelivery.id.in_(ids)))
    return len(ids)
