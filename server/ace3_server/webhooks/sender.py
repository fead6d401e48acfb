"""One webhook POST: the claimed delivery, its signed request to the checked address, and its
outcome. The whole attempt (DNS lookup and address check, connecting, sending, reading the
answer) is bounded by ``ACE3_WEBHOOK_TIMEOUT_SECONDS`` in all: httpx's own timeouts apply to
each read or write, so a receiver trickling its answer byte by byte would otherwise hold the
delivery open indefinitely."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from ace3.webhooks import (
    DELIVERY_ID_HEADER,
    SIGNATURE_HEADER,
    WEBHOOK_ID_HEADER,
    signature_header,
)
from ace3_control.settings import Settings
from ace3_server.webhooks.urls import check_target

MAX_RESPONSE_BYTES = 64 * 1024
USER_AGENT = "ACE3-Webhooks/1"


@dataclass(frozen=True)
class Claimed:
    delivery_id: str
    webhook_id: str
    attempt: int
    url: str
    secret: str
    body: bytes
    owner_id: str = ""


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


def delivery_client() -> httpx.AsyncClient:
    """The client of the delivery loop. No kept-alive connections: httpcore pools connections
    by scheme, IP and port, and the POSTs go to pinned IPs, so a kept HTTPS connection would be
    reused for another host name on the same IP, whose TLS handshake (SNI, certificate check)
    named the first host. Each POST opens its own connection."""
    return httpx.AsyncClient(
        follow_redirects=False,
        trust_env=False,
        limits=httpx.Limits(max_keepalive_connections=0),
    )


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
    """One signed POST; no redirects followed, at most ``MAX_RESPONSE_BYTES`` of the answer
    read, all of it (the address check included) within ``webhook_timeout_seconds``."""
    started = time.monotonic()

    def outcome(status_code: int | None, error: str | None) -> Outcome:
        return Outcome(status_code, error, round((time.monotonic() - started) * 1000, 1))

    limit = settings.webhook_timeout_seconds
    try:
        async with asyncio.timeout(limit):
            return await _attempt(client, claimed, settings, outcome)
    except TimeoutError:
        return outcome(None, f"timed out after {limit:g} s (ACE3_WEBHOOK_TIMEOUT_SECONDS)")


async def _attempt(
    client: httpx.AsyncClient,
    claimed: Claimed,
    settings: Settings,
    outcome: Callable[[int | None, str | None], Outcome],
) -> Outcome:
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
