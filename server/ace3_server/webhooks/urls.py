"""Which URLs a webhook may POST to: http(s), no credentials, and (unless
``ACE3_WEBHOOK_ALLOW_PRIVATE_NETWORKS``) only public addresses, checked when the webhook is
created and again before every delivery, since DNS answers can change (server-side request
forgery: a webhook must not reach the cluster's own services or a cloud metadata endpoint)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

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


def address_problem(address: str) -> str | None:
    """Why this IP address may not receive webhooks, or None for a public one."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_global and not ip.is_multicast:
        return None
    if ip.is_unspecified:
        kind = "an unspecified (this host)"
    elif ip.is_loopback:
        kind = "a loopback"
    elif ip.is_link_local:
        kind = "a link-local (cloud metadata)"
    elif ip.is_private:
        kind = "a private"
    else:
        kind = "a non-public"
    return (
        f"points at {kind} address ({ip}); set ACE3_WEBHOOK_ALLOW_PRIVATE_NETWORKS=true on a "
        "self-hosted cluster that posts inside its own network"
    )


async def resolve(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    return sorted({str(info[4][0]) for info in infos})


@dataclass(frozen=True)
class Target:
    """Where to POST: ``address`` is the checked IP to connect to (None: let httpx resolve,
    when private networks are allowed), ``problem`` why not to POST at all."""

    problem: str | None = None
    address: str | None = None


async def check_target(url: str, *, allow_private_networks: bool) -> Target:
    """Check ``url`` and, unless private networks are allowed, every address its host resolves
    to; the first is the one to connect to (so a DNS answer that changes after the check is
    never used)."""
    problem = syntax_problem(url)
    if problem is not None or allow_private_networks:
        return Target(problem)
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        addresses = [str(ipaddress.ip_address(host))]
    except ValueError:
        try:
            addresses = await resolve(host, port)
        except (OSError, UnicodeError) as exc:
            return Target(f"host {host!r} does not resolve ({exc})")
    if not addresses:
        return Target(f"host {host!r} does not resolve")
    for address in addresses:
        problem = address_problem(address)
        if problem is not None:
            return Target(problem)
    return Target(address=addresses[0])


async def url_problem(url: str, *, allow_private_networks: bool) -> str | None:
    """What keeps ACE3 from POSTing to ``url`` now, or None."""
    return (await check_target(url, allow_private_networks=allow_private_networks)).problem
