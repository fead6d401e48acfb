"""The delivery loop of every API process: outbox rows become deliveries, due deliveries are
POSTed, signed, outside any transaction, and retried with exponential backoff.

Several API processes may run it: each pass claims outbox rows and due deliveries with
``FOR UPDATE SKIP LOCKED`` and, before POSTing, moves a claimed delivery's ``next_attempt_at``
past the attempts' time limits (``ACE3_WEBHOOK_TIMEOUT_SECONDS`` bounds each whole attempt, DNS
lookup included), so a process that dies mid-POST leaves it to be retried by another
(delivery is at least once; the body's ``id`` lets receivers drop repeats). Each webhook's
deliveries are POSTed in order by one task of this process; a slow receiver holds up only its own.
A process POSTs to at most ``MAX_WEBHOOKS_IN_FLIGHT`` webhooks at once, and to at most
``MAX_IN_FLIGHT_PER_OWNER`` of one owner's, so one owner's slow receivers cannot take every slot.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter, defaultdict
from collections.abc import Collection, Mapping
from datetime import timedelta

import httpx
from sqlalchemy import select, true
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ace3_control.models import (
    DeliveryState,
    Webhook,
    WebhookDelivery,
    utcnow,
)
from ace3_control.settings import Settings
from ace3_server.services.publishing import Publisher
from ace3_server.webhooks.outbox import BATCH, fan_out, prune
from ace3_server.webhooks.sender import Claimed, Outcome, delivery_client, encode, post

__all__ = ["Claimed", "DeliveryLoop", "Outcome", "claim_due", "post", "record", "retry_delay"]

logger = logging.getLogger(__name__)

MAX_HISTORY = 50
MAX_DELAY_SECONDS = 6 * 3600.0
PRUNE_INTERVAL_SECONDS = 600.0
MAX_WEBHOOKS_IN_FLIGHT = 200
MAX_IN_FLIGHT_PER_OWNER = 5


def retry_delay(attempts: int, base_seconds: float) -> float:
    """The wait after the ``attempts``-th failed POST: base x 6^(attempts-1) (5 s, 30 s, 3 min,
    18 min, ...), capped at six hours, +-20 % jitter so that failed receivers are not hit in
    bursts."""
    delay = min(base_seconds * 6 ** max(0, attempts - 1), MAX_DELAY_SECONDS)
    return delay * random.uniform(0.8, 1.2)


async def claim_due(
    session: AsyncSession,
    settings: Settings,
    busy: Collection[str] = (),
    *,
    owners_busy: Mapping[str, int] | None = None,
    room: int = MAX_WEBHOOKS_IN_FLIGHT,
) -> list[Claimed]:
    """Take due deliveries (of webhooks not in ``busy``, those this process is POSTing to):
    count the attempt and push ``next_attempt_at`` past the attempts' time limits, so no other
    process takes them meanwhile. At most ``room`` more webhooks are taken, and none of an
    owner who already has ``MAX_IN_FLIGHT_PER_OWNER`` in flight (``owners_busy``, counted
    with the ones taken here); the rows left are not touched and stay due."""
    now = utcnow()
    not_busy = WebhookDelivery.webhook_id.not_in(list(busy)) if busy else true()
    candidates = (
        await session.execute(
            select(WebhookDelivery, Webhook.url, Webhook.secret)
            .join(Webhook, Webhook.id == WebhookDelivery.webhook_id)
            .where(
                WebhookDelivery.state == DeliveryState.PENDING,
                WebhookDelivery.next_attempt_at <= now,
                Webhook.disabled.is_(False),
                not_busy,
            )
            .order_by(WebhookDelivery.created_at, WebhookDelivery.id)  # the events' order
            .limit(BATCH)
            .with_for_update(skip_locked=True, of=WebhookDelivery)
        )
    ).all()
    per_owner = Counter(owners_busy or {})
    taken: set[str] = set()
    admitted = []
    for delivery, url, secret in candidates:
        if delivery.webhook_id not in taken:
            if len(taken) >= room or per_owner[delivery.owner_id] >= MAX_IN_FLIGHT_PER_OWNER:
                continue
            taken.add(delivery.webhook_id)
            per_owner[delivery.owner_id] += 1
        admitted.append((delivery, url, secret))
    rows = admitted
    # One webhook's deliveries are POSTed one after the other, each attempt (DNS lookup
    # included) within the timeout: hold them all that long.
    most = max(Counter(delivery.webhook_id for delivery, _, _ in rows).values(), default=0)
    hold = (most + 1) * settings.webhook_timeout_seconds + 30
    held_until = now + timedelta(seconds=hold)
    claimed = []
    for delivery, url, secret in rows:
        delivery.attempts += 1
        delivery.next_attempt_at = held_until
        claimed.append(
            Claimed(
                delivery.id,
                delivery.webhook_id,
                delivery.attempts,
                url,
                secret,
                encode(delivery.payload),
                delivery.owner_id,
            )
        )
    return claimed


async def record(
    session: AsyncSession, claimed: Claimed, result: Outcome, settings: Settings
) -> None:
    delivery = await session.get(WebhookDelivery, claimed.delivery_id, with_for_update=True)
    if (
        delivery is None
        or delivery.state != DeliveryState.PENDING
        or delivery.attempts != claimed.attempt
    ):
        return  # deleted with its webhook, or taken over after this process stalled
    now = utcnow()
    entry = {
        "attempt": claimed.attempt,
        "at": now.isoformat(),
        "status_code": result.status_code,
        "error": result.error,
        "duration_ms": result.duration_ms,
    }
    delivery.history = [*delivery.history, entry][-MAX_HISTORY:]
    delivery.last_status_code = result.status_code
    delivery.last_error = result.error
    delivery.last_duration_ms = result.duration_ms
    if result.delivered:
        delivery.state = DeliveryState.DELIVERED
        delivery.delivered_at = now
    elif delivery.attempts >= settings.webhook_max_attempts:
        delivery.state = DeliveryState.FAILED
    else:
        delay = retry_delay(delivery.attempts, settings.webhook_retry_base_seconds)
        delivery.next_attempt_at = now + timedelta(seconds=delay)
    log = logger.info if result.delivered else logger.warning
    log(
        "webhook %s delivery %s (%s) attempt %d: %s in %.0f ms -> %s",
        claimed.webhook_id,
        claimed.delivery_id,
        delivery.event_type,
        claimed.attempt,
        result.status_code if result.error is None else result.error,
        result.duration_ms,
        delivery.state,
    )


async def deliver_in_order(
    session_factory: async_sessionmaker[AsyncSession],
    client: httpx.AsyncClient,
    claimed: list[Claimed],
    settings: Settings,
) -> None:
    """POST one webhook's claimed deliveries one after the other, recording each outcome."""
    for item in claimed:
        result = await post(client, item, settings)
        async with session_factory() as session:
            await record(session, item, result, settings)
            await session.commit()


class DeliveryLoop:
    """One task per webhook being POSTed to, so a slow receiver delays only its own
    deliveries; each pass fans out the outbox and claims what is due for the other webhooks."""

    def __init__(
        self,
        session_factory: async_sessionmaker[AsyncSession],
        client: httpx.AsyncClient,
        settings: Settings,
    ):
        self.session_factory = session_factory
        self.client = client
        self.settings = settings
        self.in_flight: dict[str, asyncio.Task[None]] = {}
        self.owner_of: dict[str, str] = {}  # webhook id -> owner id, for those in flight

    async def pass_once(self) -> int:
        """Fan out, then start POSTing what is due; returns the deliveries claimed."""
        async with self.session_factory() as session:
            await fan_out(session)
            await session.commit()
        room = MAX_WEBHOOKS_IN_FLIGHT - len(self.in_flight)
        if room <= 0:
            return 0
        async with self.session_factory() as session:
            claimed = await claim_due(
                session,
                self.settings,
                busy=set(self.in_flight),
                owners_busy=Counter(self.owner_of.values()),
                room=room,
            )
            await session.commit()
        by_webhook: dict[str, list[Claimed]] = defaultdict(list)
        for item in claimed:
            by_webhook[item.webhook_id].append(item)
        for webhook_id, items in by_webhook.items():
            self.owner_of[webhook_id] = items[0].owner_id
            self.in_flight[webhook_id] = asyncio.create_task(self._send(webhook_id, items))
        return len(claimed)

    async def _send(self, webhook_id: str, items: list[Claimed]) -> None:
        try:
            await deliver_in_order(self.session_factory, self.client, items, self.settings)
        except Exception:
            logger.exception("webhook %s: recording a delivery failed; it is retried", webhook_id)
        finally:
            self.in_flight.pop(webhook_id, None)
            self.owner_of.pop(webhook_id, None)

    async def drain(self) -> None:
        """Wait for the POSTs under way (tests; the loop cancels them on shutdown)."""
        while self.in_flight:
            await asyncio.gather(*self.in_flight.values(), return_exceptions=True)

    async def close(self) -> None:
        tasks = list(self.in_flight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def run_webhook_deliveries(
    session_factory: async_sessionmaker[AsyncSession], publisher: Publisher, settings: Settings
) -> None:
    """The API's background loop (``publisher`` is unused: the signature of every loop)."""
    del publisher
    next_prune = 0.0
    async with delivery_client() as client:
        loop = DeliveryLoop(session_factory, client, settings)
        try:
            while True:
                try:
                    await loop.pass_once()
                    if time.monotonic() >= next_prune:
                        async with session_factory() as session:
                            await prune(session, settings)
                            await session.commit()
                        next_prune = time.monotonic() + PRUNE_INTERVAL_SECONDS
                except Exception:
                    logger.exception("webhook delivery pass failed; trying again next interval")
                await asyncio.sleep(settings.webhook_poll_seconds)
        finally:
            await loop.close()
