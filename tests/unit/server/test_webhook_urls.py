"""The webhook URL checks: form (scheme, credentials, length) and, unless private networks are
allowed, the addresses the host resolves to (no loopback, private, link-local or metadata)."""

from __future__ import annotations

import asyncio

import pytest

from ace3_server.webhooks import urls
from ace3_server.webhooks.delivery import retry_delay
from ace3_server.webhooks.events import subscribed, unknown_events


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
        ("http://localhost/hook", "loopback"),
        ("http://[::1]/hook", "loopback"),
        ("http://10.1.2.3/hook", "private"),
        ("http://192.168.0.7/hook", "private"),
        ("http://169.254.169.254/latest/meta-data", "link-local"),
        ("http://[::ffff:127.0.0.1]/hook", "loopback"),
        ("http://0.0.0.0/hook", "unspecified"),
    ],
)
def test_private_addresses_are_refused_unless_allowed(url: str, kind: str) -> None:
    problem = check(url)
    assert problem is not None and kind in problem
    assert "ACE3_WEBHOOK_ALLOW_PRIVATE_NETWORKS" in problem
    assert check(url, allow=True) is None


def test_a_public_address_is_accepted() -> None:
    assert check("https://8.8.8.8/hook") is None


def test_a_host_resolving_to_a_private_address_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    async def rebound(host: str, port: int) -> list[str]:
        return ["93.184.216.34", "10.0.0.5"]

    monkeypatch.setattr(urls, "resolve", rebound)
    problem = check("https://hooks.example.com/x")
    assert problem is not None and "a private address (10.0.0.5)" in problem


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
