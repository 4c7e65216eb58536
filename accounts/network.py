"""Who is on the other end of the socket: the client IP, trusting X-Forwarded-For only from our proxies.

A client can put anything in X-Forwarded-For; only a hop appended by a configured proxy
(`settings.TRUSTED_PROXIES`, CIDRs) is believed (docs/kernle-protocol.md §2.9: the legacy rate limiter
was bypassed by spoofing this header). We walk the chain from the right — the hops our own
proxies appended — and stop at the first address that is not one of them: the right-most
untrusted address is the client, and whatever it wrote further left is ignored. No proxy is
trusted unless configured (the default is none), so on a school network a client that sends the
header is simply counted under its own address. The web server must not rewrite the peer address
itself (the runner starts uvicorn with `--no-proxy-headers`), or this decision would be made twice.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from typing import Any

from django.conf import settings

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@lru_cache(maxsize=8)
def _networks(cidrs: tuple[str, ...]) -> tuple[IpNetwork, ...]:
    return tuple(ipaddress.ip_network(cidr, strict=False) for cidr in cidrs)


def _parse(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    value = value.strip()
    if value.startswith("[") and "]" in value:  # "[::1]:443"
        value = value[1:value.index("]")]
    elif value.count(":") == 1:  # "1.2.3.4:5678"
        value = value.split(":", 1)[0]
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        return None


def _trusted(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    networks = _networks(tuple(getattr(settings, "TRUSTED_PROXIES", ())))
    return any(address in network for network in networks if address.version == network.version)


def client_ip(request: Any) -> str:
    """The client's IP as a string ("unknown" if even REMOTE_ADDR is unusable)."""
    meta = request.META
    remote = _parse(str(meta.get("REMOTE_ADDR", "")))
    if remote is None:
        return "unknown"
    if not _trusted(remote):
        return str(remote)
    forwarded = str(meta.get("HTTP_X_FORWARDED_FOR", ""))
    client = remote
    for hop in reversed([part for part in forwarded.split(",") if part.strip()]):
        address = _parse(hop)
        if address is None:
            break  # garbage in the chain: believe nothing further left of it
        client = address
        if not _trusted(address):
            break
    return str(client)
