"""The delivery loop of every API process: outbox rows become deliveries, due deliveries are
POSTed, signed, outside any transaction, and retried with exponential backoff.

Several API processes may run it: each pass claims outbox rows and due deliveries with
``FOR UPDATE SKIP LOCKED`` and, before POSTing, moves a claimed delivery's ``next_attempt_at``
past the request's timeout, so a process that dies mid-POST leaves it to be retried by another
(delivery is at least once; the body's ``id`` lets receivers drop repeats).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from ace3.webhooks import SIGNATURE_HEADER, WEBHOOK_ID_HEADER, signature_header
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


async def claim_due(session: AsyncSession, settings: Settings) -> list[Claimed]:
    """Take due deliveries: count the attempt and push ``next_attempt_at`` past the POST's
    timeout, so no other process takes them while this one POSTs."""
    now = utcnow()
    rows = (
        await session.execute(
            select(WebhookDelivery, Webhook.url, Webhook.secret)
            .join(Webhook, Webhook.id == WebhookDelivery.webhook_id)
            .where(
                WebhookDelivery.state == DeliveryState.PENDING,
                WebhookDelivery.next_attempt_at <= now,
                Webhook.disabled.is_(False),
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
        claimed.url, allow_private_networks=settings.webhook_allow_private_networks
    )
    if target.problem is not None:
        return outcome(None, f"refused: the URL {target.problem}")
    headers = {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        WEBHOOK_ID_HEADER: claimed.webhook_id,
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


async def deliver(
    session_factory: async_sessionmaker[AsyncSession],
    client: httpx.AsyncClient,
    claimed: list[Claimed],
    settings: Settings,
) -> None:
    """POST each webhook's deliveries in order, different webhooks side by side."""
    by_webhook: dict[str, list[Claimed]] = defaultdict(list)
    for item in claimed:
        by_webhook[item.webhook_id].append(item)

    async def one_webhook(items: list[Claimed]) -> None:
        for item in items:
            result = await post(client, item, settings)
            async with session_factory() as session:
                await record(session, item, result, settings)
                await session.commit()

    await asyncio.gather(*(one_webhook(items) for items in by_webhook.values()))


async def deliver_once(
    session_factory: async_sessionmaker[AsyncSession],
    client: httpx.AsyncClient,
    settings: Settings,
) -> int:
    """One pass: fan out the outbox, then POST what is due. Returns the deliveries POSTed."""
    async with session_factory() as session:
        await fan_out(session)
        await session.commit()
    async with session_factory() as session:
        claimed = await claim_due(session, settings)
        await session.commit()
    if claimed:
        await deliver(session_factory, client, claimed, settings)
    return len(claimed)


async def run_webhook_deliveries(
    session_factory: async_sessionmaker[AsyncSession], publisher: JobPublisher, settings: Settings
) -> None:
    """The API's background loop (``publisher`` is unused: the signature of every loop)."""
    del publisher
    next_prune = 0.0
    async with httpx.AsyncClient(follow_redirects=False, trust_env=False) as client:
        while True:
            posted = 0
            try:
                posted = await deliver_once(session_factory, client, settings)
                if time.monotonic() >= next_prune:
                    async with session_factory() as session:
                        await prune(session, settings)
                        await session.commit()
                    next_prune = time.monotonic() + PRUNE_INTERVAL_SECONDS
            except Exception:
                logger.exception("webhook delivery pass failed; trying again next interval")
            if posted < BATCH:
                await asyncio.sleep(settings.webhook_poll_seconds)
