"""The webhook URL checks: form (scheme, credentials, length) and, unless private networks are
allowed, the addresses the host resolves to (no loopback, private, link-local or metadata)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import cast

import httpx
import pytest

from ace3.webhooks import verify_signature
from ace3_control.settings import Settings
from ace3_server.webhooks import urls
from ace3_server.webhooks.delivery import Claimed, Outcome, post, retry_delay
from ace3_server.webhooks.events import subscribed, unknown_events
from ace3_server.webhooks.sender import delivery_client


def check(url: str, *, allow: bool = False) -> str | None:
    return asyncio.run(urls.url_problem(url, allow_private_networks=allow))


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("ftp://example.com/hook", "http or https"),
        ("file:///etc/passwd", "http or https"),
        ("https://user:pw@example.com/hook", "credentials"),
        ("https:///hook", "no host"),
        ("https://example.com/" + "a" * 2100, "longer than 2048"),
        ("https://exa mple.com/", "whitespace"),
    ],
)
def test_malformed_urls_are_refused_even_on_private_networks(url: str, problem: str) -> None:
    found = check(url, allow=True)
    assert found is not None and problem in found


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("http://127.0.0.1:8080/hook", "loopback"),
        ("http://[::1]/hook", "loopback"),
        ("http://10.1.2.3/hook", "private"),
        ("http://192.168.0.7/hook", "private"),
        ("http://169.254.169.254/latest/meta-data", "link-local"),
        ("http://[::ffff:127.0.0.1]/hook", "loopback"),
        ("http://0.0.0.0/hook", "unspecified"),
        # IPv4 embedded in IPv6: NAT64, 6to4, IPv4-compatible, SIIT, Teredo
        ("http://[64:ff9b::a9fe:a9fe]/hook", "link-local"),
        ("http://[64:ff9b:1::a00:1]/hook", "non-public"),
        ("http://[2002:a00:1::1]/hook", "private"),
        ("http://[::a00:1]/hook", "private"),
        ("http://[::ffff:0:7f00:1]/hook", "loopback"),
        ("http://[2001:0:4136:e378:8000:63bf:f5ff:fffe]/hook", "private"),
        ("http://[fec0::1]/hook", "non-public"),
        ("http://100.64.0.1/hook", "non-public"),
        ("http://198.18.0.1/hook", "private"),
    ],
)
def test_private_addresses_are_refused_unless_allowed(url: str, kind: str) -> None:
    problem = check(url)
    assert problem is not None and kind in problem
    assert "ACE3_WEBHOOK_ALLOW_PRIVATE_NETWORKS" in problem
    assert check(url, allow=True) is None


@pytest.mark.parametrize(
    "host", ["8.8.8.8", "[2606:4700::1111]", "[64:ff9b::808:808]", "[2002:808:808::1]"]
)
def test_a_public_address_is_accepted(host: str) -> None:
    assert check(f"https://{host}/hook") is None


def test_a_host_resolving_to_a_private_address_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    async def rebound(host: str, port: int) -> list[str]:
        return ["93.184.216.34", "10.0.0.5"]

    monkeypatch.setattr(urls, "resolve", rebound)
    problem = check("https://hooks.example.com/x")
    assert problem is not None and "resolves to a non-public address" in problem
    assert "10.0.0.5" not in problem  # no oracle of the cluster's internal DNS


def test_a_name_that_does_not_resolve_gets_the_same_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def nxdomain(host: str, port: int) -> list[str]:
        raise OSError("[Errno -2] Name or service not known")

    monkeypatch.setattr(urls, "resolve", nxdomain)
    assert check("https://db.internal/x") == urls.unresolvable("db.internal")
    assert "Errno" not in urls.unresolvable("db.internal")


def test_a_dns_lookup_that_hangs_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    async def hang(host: str, port: int) -> list[str]:
        await asyncio.sleep(30)
        return ["8.8.8.8"]

    monkeypatch.setattr(urls, "resolve", hang)

    async def run() -> str | None:
        return await urls.url_problem(
            "https://slow.example.com/", allow_private_networks=False, dns_timeout=0.05
        )

    assert asyncio.run(asyncio.wait_for(run(), 5)) == urls.unresolvable("slow.example.com")


def test_subscriptions_and_event_names() -> None:
    assert subscribed(["job.*"], "job.failed") and not subscribed(["job.*"], "search.failed")
    assert subscribed(["*"], "search.succeeded") and subscribed(["job.failed"], "ping")
    assert not subscribed(["job.failed"], "job.succeeded")
    assert unknown_events(["job.succeeded", "job.exploded", "search.*", "trial.*"]) == [
        "job.exploded",
        "trial.*",
    ]


def test_retry_delays_grow_exponentially_with_jitter() -> None:
    delays = [retry_delay(attempt, 5.0) for attempt in (1, 2, 3)]
    assert 4 <= delays[0] <= 6 and 24 <= delays[1] <= 36 and 144 <= delays[2] <= 216
    assert retry_delay(40, 5.0) <= 6 * 3600 * 1.2


def _claimed(url: str) -> Claimed:
    return Claimed("d1", "w1", 1, url, "whsec_x", b'{"id":"d1"}')


def _post(url: str, handler: Callable[[httpx.Request], httpx.Response]) -> Outcome:
    settings = Settings(webhook_allow_private_networks=False)

    async def run() -> Outcome:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await post(client, _claimed(url), settings)

    return asyncio.run(run())


def test_a_delivery_connects_to_the_checked_address_under_the_urls_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def public(host: str, port: int) -> list[str]:
        return ["93.184.216.34"]

    monkeypatch.setattr(urls, "resolve", public)
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, stream=httpx.ByteStream(b"x" * 200_000))

    result = _post("https://hooks.example.com:8443/in?x=1", handler)
    assert result.delivered and result.error is None
    request = seen[0]
    assert str(request.url) == "https://93.184.216.34:8443/in?x=1"
    assert request.headers["host"] == "hooks.example.com:8443"
    assert request.extensions["sni_hostname"] == "hooks.example.com"
    assert request.headers["ace3-webhook-id"] == "w1"
    assert verify_signature("whsec_x", request.content, request.headers["ace3-signature"])


def test_a_host_that_now_resolves_privately_is_not_posted_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def rebound(host: str, port: int) -> list[str]:
        return ["169.254.169.254"]

    monkeypatch.setattr(urls, "resolve", rebound)

    def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError("no request may be sent")

    result = _post("http://hooks.example.com/in", handler)
    assert not result.delivered and result.status_code is None
    assert result.error == "refused: the URL " + urls.unresolvable("hooks.example.com")


def test_a_redirect_is_not_followed_and_counts_as_a_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            302, headers={"location": "http://169.254.169.254/"}, stream=httpx.ByteStream(b"")
        )

    result = _post("http://93.184.216.34/in", handler)
    assert result.status_code == 302 and not result.delivered
    assert result.error == "HTTP 302: redirects are not followed"


def test_a_receiver_trickling_its_answer_is_cut_off_at_the_total_timeout() -> None:
    async def trickle() -> AsyncIterator[bytes]:
        for _ in range(100):  # each chunk well within any per-read timeout
            await asyncio.sleep(0.05)
            yield b"."

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=cast(httpx.AsyncByteStream, _Stream(trickle())))

    settings = Settings(webhook_allow_private_networks=True, webhook_timeout_seconds=0.3)

    async def run() -> Outcome:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await post(client, _claimed("http://hooks.example.com/in"), settings)

    started = time.monotonic()
    result = asyncio.run(run())
    assert time.monotonic() - started < 2
    assert not result.delivered and result.status_code is None
    assert result.error == "timed out after 0.3 s (ACE3_WEBHOOK_TIMEOUT_SECONDS)"


def test_a_slow_dns_answer_counts_against_the_attempts_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def slow(host: str, port: int) -> list[str]:
        await asyncio.sleep(0.25)
        return ["93.184.216.34"]

    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.25)
        return httpx.Response(204)

    monkeypatch.setattr(urls, "resolve", slow)
    settings = Settings(webhook_timeout_seconds=0.4, webhook_dns_timeout_seconds=5)

    async def run() -> Outcome:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await post(client, _claimed("http://hooks.example.com/in"), settings)

    result = asyncio.run(run())
    assert result.error is not None and result.error.startswith("timed out after 0.4 s")


def test_the_delivery_client_keeps_no_connection_alive() -> None:
    async def run() -> int:
        async with delivery_client() as client:
            transport = cast(httpx.AsyncHTTPTransport, client._transport)
            return transport._pool._max_keepalive_connections

    # A kept connection would be reused for another host name pinned to the same IP, whose TLS
    # handshake named the first host.
    assert asyncio.run(run()) == 0


class _Stream(httpx.AsyncByteStream):
    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.chunks:
            yield chunk


def test_dns_lookups_run_at_most_a_few_at_once() -> None:
    running = 0
    most = 0

    async def getaddrinfo(*args: object, **kwargs: object) -> list[tuple[object, ...]]:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.02)
        running -= 1
        return [(0, 0, 0, "", ("93.184.216.34", 443))]

    async def run() -> list[list[str]]:
        loop = asyncio.get_running_loop()
        loop.getaddrinfo = getaddrinfo  # type: ignore[method-assign,assignment]
        return await asyncio.gather(*(urls.resolve(f"h{n}.test", 443) for n in range(30)))

    assert asyncio.run(run()) == [["93.184.216.34"]] * 30
    assert most == urls.MAX_CONCURRENT_LOOKUPS
