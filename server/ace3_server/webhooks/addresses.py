"""Which IP addresses may receive webhooks: public unicast only. ``ipaddress``'s ``is_global``
alone is not enough: it calls 6to4, NAT64, IPv4-compatible and SIIT addresses global whatever
IPv4 address they carry (``2002:a00:1::`` reaches 10.0.0.1 through a 6to4 relay), and site-local
``fec0::/10`` global too. So the IPv4 address embedded in such an IPv6 address is checked in its
place, and an explicit list of special-purpose ranges is refused besides ``is_global``."""

from __future__ import annotations

import ipaddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# IANA special-purpose registries (RFC 6890 and successors): never a webhook receiver.
DENIED_NETWORKS = tuple(
    ipaddress.ip_network(net)
    for net in (
        "0.0.0.0/8",  # this network
        "10.0.0.0/8",
        "100.64.0.0/10",  # carrier-grade NAT
        "127.0.0.0/8",
        "169.254.0.0/16",  # link-local, cloud metadata
        "172.16.0.0/12",
        "192.0.0.0/24",  # IETF protocol assignments
        "192.0.2.0/24",
        "192.88.99.0/24",  # 6to4 relay anycast
        "192.168.0.0/16",
        "198.18.0.0/15",  # benchmarking
        "198.51.100.0/24",
        "203.0.113.0/24",
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, broadcast
        "::/128",
        "::1/128",
        "64:ff9b:1::/48",  # local-use NAT64 (RFC 8215)
        "100::/64",  # discard-only
        "2001::/23",  # IETF protocol assignments (Teredo's client is checked below)
        "2001:db8::/32",  # documentation
        "3fff::/20",  # documentation
        "5f00::/16",  # SRv6 SIDs
        "fc00::/7",  # unique local
        "fe80::/10",  # link-local
        "fec0::/10",  # site-local (deprecated, still routed inside some networks)
        "ff00::/8",  # multicast
    )
)
NAT64 = ipaddress.ip_network("64:ff9b::/96")
SIIT = ipaddress.ip_network("::ffff:0:0:0/96")
IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses a packet to ``ip`` may end up at (IPv4-mapped, SIIT, NAT64,
    IPv4-compatible, 6to4, Teredo server and client)."""
    found: list[ipaddress.IPv4Address] = []
    last32 = ipaddress.IPv4Address(ip.packed[-4:])
    if ip.ipv4_mapped is not None:
        found.append(ip.ipv4_mapped)
    if ip in SIIT or ip in NAT64 or (ip in IPV4_COMPATIBLE and int(ip) > 1):
        found.append(last32)
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)
    return found


def kind_of(ip: IPAddress) -> str | None:
    """What makes ``ip`` unfit to receive webhooks ("a loopback", ...), or None if it is a
    public unicast address."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return kind_of(ip.ipv4_mapped)
        for inner in embedded_ipv4(ip):
            kind = kind_of(inner)
            if kind is not None:
                return kind
    denied = any(ip.version == net.version and ip in net for net in DENIED_NETWORKS)
    if ip.is_global and not ip.is_multicast and not denied:
        return None
    if ip.is_unspecified:
        return "an unspecified (this host)"
    if ip.is_loopback:
        return "a loopback"
    if ip.is_link_local:
        return "a link-local (cloud metadata)"
    if ip.is_private:
        return "a private"
    return "a non-public"
