"""The delivery loop of every API process: outbox rows become deliveries, due deliveries are
POSTed, signed, outside any transaction, and retried with exponential backoff.

Several API processes may run it: each pass claims outbox rows and due deliveries with
``FOR UPDATE SKIP LOCKED`` and, before POSTing, moves a claimed delivery's ``next_attempt_at``
past the request's timeout, so a process that dies mid-POST leaves it to be retried by another
(delivery is at least once; the body's ``id`` lets receivers drop repeats). Each webhook's
deliveries are POSTed in order by one task of this process; a slow receiver holds up only its own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections import Counter, defaultdict
from collections.abc import Collection
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
from sqlalchemy import select, true
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ace3.webhooks import (
    DELIVERY_ID_HEADER,
    SIGNATURE_HEADER,
    WEBHOOK_ID_HEADER,
    signature_header,
)
from ace3_control.models import (
    DeliveryState,
    Webhook,
    WebhookDelivery,
    utcnow,
)
from ace3_control.queue import JobPublisher
from ace3_control.settings import Settings
from ace3_server.webhooks.outbox import BATCH, fan_out, prune
from ace3_server.webhooks.urls import check_target

logger = logging.getLogger(__name__)

MAX_RESPONSE_BYTES = 64 * 1024
MAX_HISTORY = 50
MAX_DELAY_SECONDS = 6 * 3600.0
USER_AGENT = "ACE3-Webhooks/1"
PRUNE_INTERVAL_SECONDS = 600.0
MAX_WEBHOOKS_IN_FLIGHT = 200


def retry_delay(attempts: int, base_seconds: float) -> float:
    """The wait after the ``attempts``-th failed POST: base x 6^(attempts-1) (5 s, 30 s, 3 min,
    18 min, ...), capped at six hours, +-20 % jitter so that failed receivers are not hit in
    bursts."""
    delay = min(base_seconds * 6 ** max(0, attempts - 1), MAX_DELAY_SECONDS)
    return delay * random.uniform(0.8, 1.2)


@dataclass(frozen=True)
class Claimed:
    delivery_id: str
    webhook_id: str
    attempt: int
    url: str
    secret: str
    body: bytes


@dataclass(frozen=True)
class Outcome:
    status_code: int | None
    error: str | None
    duration_ms: float

    @property
    def delivered(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def encode(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()


async def claim_due(
    session: AsyncSession, settings: Settings, busy: Collection[str] = ()
) -> list[Claimed]:
    """Take due deliveries (of webhooks not in ``busy``, those this process is POSTing to):
    count the attempt and push ``next_attempt_at`` past the POSTs' timeouts, so no other
    process takes them meanwhile."""
    now = utcnow()
    not_busy = WebhookDelivery.webhook_id.not_in(list(busy)) if busy else true()
    rows = (
        await session.execute(
            select(WebhookDelivery, Webhook.url, Webhook.secret)
            .join(Webhook, Webhook.id == WebhookDelivery.webhook_id)
            .where(
                WebhookDelivery.state == DeliveryState.PENDING,
                WebhookDelivery.next_attempt_at <= now,
                Webhook.disabled.is_(False),
                not_busy,
            )
            .order_by(WebhookDelivery.created_at, WebhookDelivery.id)
            .limit(BATCH)
            .with_for_update(skip_locked=True, of=WebhookDelivery)
        )
    ).all()
    # One webhook's deliveries are POSTed one after the other: hold them all that long.
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
            )
        )
    return claimed


def pinned(
    url: str, address: str | None, headers: dict[str, str]
) -> tuple[httpx.URL, dict[str, Any]]:
    """The URL to request and its httpx extensions. With a checked ``address``, connect to it
    rather than to what DNS answers next; the Host header and TLS (SNI and the certificate
    check) still name the URL's host."""
    parsed = httpx.URL(url)
    if address is None:
        return parsed, {}
    headers["host"] = parsed.netloc.decode("ascii")
    extensions = (
        {"sni_hostname": parsed.raw_host.decode("ascii")} if parsed.scheme == "https" else {}
    )
    return parsed.copy_with(host=address), extensions


async def post(client: httpx.AsyncClient, claimed: Claimed, settings: Settings) -> Outcome:
    """One signed POST; no redirects followed, at most ``MAX_RESPONSE_BYTES`` of the answer read."""
    started = time.monotonic()

    def outcome(status_code: int | None, error: str | None) -> Outcome:
        return Outcome(status_code, error, round((time.monotonic() - started) * 1000, 1))

    target = await check_target(
        claimed.url,
        allow_private_networks=settings.webhook_allow_private_networks,
        dns_timeout=settings.webhook_dns_timeout_seconds,
    )
    if target.problem is not None:
        return outcome(None, f"refused: the URL {target.problem}")
    headers = {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        WEBHOOK_ID_HEADER: claimed.webhook_id,
        DELIVERY_ID_HEADER: claimed.delivery_id,
        SIGNATURE_HEADER: signature_header(claimed.secret, claimed.body),
    }
    try:
        url, extensions = pinned(claimed.url, target.address, headers)
        async with client.stream(
            "POST",
            url,
            content=claimed.body,
            headers=headers,
            timeout=settings.webhook_timeout_seconds,
            extensions=extensions,
        ) as response:
            read = 0
            async for chunk in response.aiter_raw():
                read += len(chunk)
                if read >= MAX_RESPONSE_BYTES:
                    break
            status = response.status_code
    except (httpx.HTTPError, httpx.InvalidURL, ValueError) as exc:
        return outcome(None, f"{type(exc).__name__}: {exc}"[:500])
    if 200 <= status < 300:
        return outcome(status, None)
    if 300 <= status < 400:
        return outcome(status, f"HTTP {status}: redirects are not followed")
    return outcome(status, f"HTTP {status}")


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

    async def pass_once(self) -> int:
        """Fan out, then start POSTing what is due; returns the deliveries claimed."""
        async with self.session_factory() as session:
            await fan_out(session)
            await session.commit()
        if len(self.in_flight) >= MAX_WEBHOOKS_IN_FLIGHT:
            return 0
        async with self.session_factory() as session:
            claimed = await claim_due(session, self.settings, busy=set(self.in_flight))
            await session.commit()
        by_webhook: dict[str, list[Claimed]] = defaultdict(list)
        for item in claimed:
            by_webhook[item.webhook_id].append(item)
        for webhook_id, items in by_webhook.items():
            self.in_flight[webhook_id] = asyncio.create_task(self._send(webhook_id, items))
        return len(claimed)

    async def _send(self, webhook_id: str, items: list[Claimed]) -> None:
        try:
            await deliver_in_order(self.session_factory, self.client, items, self.settings)
        except Exception:
            logger.exception("webhook %s: recording a delivery failed; it is retried", webhook_id)
        finally:
            self.in_flight.pop(webhook_id, None)

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
    session_factory: async_sessionmaker[AsyncSession], publisher: JobPublisher, settings: Settings
) -> None:
    """The API's background loop (``publisher`` is unused: the signature of every loop)."""
    del publisher
    next_prune = 0.0
    async with httpx.AsyncClient(follow_redirects=False, trust_env=False) as client:
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
