"""Which URLs a webhook may POST to: http(s), no credentials, and (unless
``ACE3_WEBHOOK_ALLOW_PRIVATE_NETWORKS``) only public addresses, checked when the webhook is
created and again before every delivery, since DNS answers can change (server-side request
forgery: a webhook must not reach the cluster's own services or a cloud metadata endpoint)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import weakref
from dataclasses import dataclass
from urllib.parse import urlsplit

from ace3_server.webhooks.addresses import kind_of

MAX_URL_LENGTH = 2048


def syntax_problem(url: str) -> str | None:
    """What is wrong with the URL's form, or None."""
    if len(url) > MAX_URL_LENGTH:
        return f"is longer than {MAX_URL_LENGTH} characters"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"is not a valid URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return "must use the http or https scheme"
    if not parts.hostname:
        return "has no host"
    if parts.username is not None or parts.password is not None:
        return "must not hold credentials (user:password@): sign-in comes from the signature"
    if port == 0:
        return "has port 0"
    if any(ch.isspace() or ord(ch) < 32 for ch in url):
        return "must not contain whitespace or control characters"
    return None


PRIVATE_HINT = (
    "set ACE3_WEBHOOK_ALLOW_PRIVATE_NETWORKS=true on a self-hosted cluster that posts inside "
    "its own network"
)
# Concurrent DNS lookups of this process (each holds a thread of the loop's executor).
MAX_CONCURRENT_LOOKUPS = 8
_lookups: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


def address_problem(address: str) -> str | None:
    """Why this IP address may not receive webhooks, or None for a public one. Names the
    address: only for one the user typed (an IP literal URL), never one DNS answered."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    kind = kind_of(ip)
    if kind is None:
        return None
    return f"points at {kind} address ({ip}); {PRIVATE_HINT}"


def unresolvable(host: str) -> str:
    """One message whether ``host`` does not resolve or resolves to a non-public address, so
    that the answer is no oracle of the cluster's internal DNS."""
    return f"host {host!r} does not resolve, or resolves to a non-public address; {PRIVATE_HINT}"


async def resolve(host: str, port: int) -> list[str]:
    loop = asyncio.get_running_loop()
    semaphore = _lookups.setdefault(loop, asyncio.Semaphore(MAX_CONCURRENT_LOOKUPS))
    async with semaphore:
        infos = await loop.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
    return sorted({str(info[4][0]) for info in infos})


@dataclass(frozen=True)
class Target:
    """Where to POST: ``address`` is the checked IP to connect to (None: let httpx resolve,
    when private networks are allowed), ``problem`` why not to POST at all."""

    problem: str | None = None
    address: str | None = None


async def check_target(
    url: str, *, allow_private_networks: bool, dns_timeout: float = 3.0
) -> Target:
    """Check ``url`` and, unless private networks are allowed, every address its host resolves
    to (within ``dns_timeout`` seconds, waiting for a lookup slot included); the first is the
    one to connect to (so a DNS answer that changes after the check is never used)."""
    problem = syntax_problem(url)
    if problem is not None or allow_private_networks:
        return Target(problem)
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        literal = str(ipaddress.ip_address(host))
    except ValueError:
        pass
    else:  # the user typed this address: say what is wrong with it
        problem = address_problem(literal)
        return Target(problem, None if problem else literal)
    try:
        async with asyncio.timeout(dns_timeout):
            addresses = await resolve(host, port)
    except (OSError, UnicodeError, TimeoutError):
        return Target(unresolvable(host))
    if not addresses or any(address_problem(address) for address in addresses):
        return Target(unresolvable(host))
    return Target(address=addresses[0])


async def url_problem(
    url: str, *, allow_private_networks: bool, dns_timeout: float = 3.0
) -> str | None:
    """What keeps ACE3 from POSTing to ``url`` now, or None."""
    target = await check_target(
        url, allow_private_networks=allow_private_networks, dns_timeout=dns_timeout
    )
    return target.problem
