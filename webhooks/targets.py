"""Where a webhook may point: https to a public address (no SSRF into our own network).

A URL is checked when an endpoint is registered and again before every delivery, and the request
is then sent to the very address that was checked (delivery.py pins it), so a name that later
resolves somewhere private (DNS rebinding) is refused rather than followed. Redirects are never
followed. Plain http, and loopback addresses, are allowed only for 127.0.0.1/localhost receivers
when settings.DEBUG or settings.WEBHOOKS_ALLOW_LOOPBACK_HTTP is on (development and the tests).

An IPv6 address is allowed only in global unicast (2000::/3, and `is_global`), with two forms
judged by the IPv4 address they carry instead: IPv4-mapped (::ffff:a.b.c.d, which the socket
connects to over IPv4) and the well-known NAT64 prefix 64:ff9b::/96 (what DNS64 answers for an
IPv4-only host on an IPv6-only network). The other forms that embed an IPv4 address, and reach it
through a relay or tunnel we cannot vouch for, are refused whatever they carry: local-use NAT64
64:ff9b:1::/48, 6to4 2002::/16, Teredo 2001::/32, IPv4-compatible ::/96, IPv4-translated
::ffff:0:0:0/96 (`is_global` alone lets 64:ff9b::a9fe:a9fe, 2002:a9fe:a9fe:: and ::a9fe:a9fe —
169.254.169.254 — through).
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

MAX_URL_LENGTH = 2000
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class TargetRefused(ValueError):
    """A URL a webhook may not point at; the message is fit to show the admin."""


@dataclass(frozen=True)
class Target:
    url: str
    host: str
    address: str  # the checked IP the request must go to


def loopback_allowed() -> bool:
    return bool(settings.DEBUG or getattr(settings, "WEBHOOKS_ALLOW_LOOPBACK_HTTP", False))


_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052: the IPv4 address is the low 32 bits
# IPv6 forms that carry an IPv4 address to a relay or tunnel: refused whatever they carry.
_TUNNELS = (
    (ipaddress.IPv6Network("64:ff9b:1::/48"), "local-use NAT64"),  # RFC 8215: where the IPv4 sits varies
    (ipaddress.IPv6Network("2002::/16"), "6to4"),
    (ipaddress.IPv6Network("2001::/32"), "Teredo"),
    (ipaddress.IPv6Network("::/96"), "IPv4-compatible"),
    (ipaddress.IPv6Network("::ffff:0:0:0/96"), "IPv4-translated"),
)
_DOCUMENTATION = ipaddress.IPv6Network("3fff::/20")  # RFC 9637; Python 3.11 counts it global


def _refusal(address: IPAddress, *, loopback_ok: bool) -> str | None:
    """Why a webhook may not go to `address`, as shown to the admin; None when it may."""
    if address.is_loopback:
        return None if loopback_ok else str(address)
    if address.is_unspecified:
        return str(address)
    if isinstance(address, ipaddress.IPv4Address):
        return None if address.is_global and not address.is_multicast else str(address)
    inner = address.ipv4_mapped
    if inner is None and address in _NAT64:
        inner = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if inner is not None:
        return None if _refusal(inner, loopback_ok=loopback_ok) is None else f"{address}, which carries {inner}"
    for network, form in _TUNNELS:
        if address in network:
            return f"{address}: {form}, which carries an IPv4 address"
    if address not in _GLOBAL_UNICAST or address in _DOCUMENTATION or not address.is_global:
        return str(address)
    return None


def _resolve(host: str, port: int) -> list[IPAddress]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise TargetRefused(f"The host {host} could not be resolved.") from None
    return [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]


def target_checked(url: str) -> Target:
    """The URL's checked target, or TargetRefused saying why it may not be used."""
    url = url.strip()
    if len(url) > MAX_URL_LENGTH:
        raise TargetRefused(f"The URL is longer than {MAX_URL_LENGTH} characters.")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise TargetRefused("This is not a valid URL.") from None
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("https", "http") or not host:
        raise TargetRefused("Enter an https:// URL.")
    if parts.username is not None or parts.password is not None:
        raise TargetRefused("The URL must not contain a user name or password; verify the signature instead.")
    loopback_ok = loopback_allowed() and host in LOOPBACK_NAMES
    if parts.scheme == "http" and not loopback_ok:
        raise TargetRefused("Webhooks must use https:// (plain http only for 127.0.0.1 in development).")
    addresses = _resolve(host, port or (443 if parts.scheme == "https" else 80))
    if not addresses:
        raise TargetRefused(f"The host {host} could not be resolved.")
    refused = [why for why in (_refusal(address, loopback_ok=loopback_ok) for address in addresses) if why]
    if refused:
        # One private address among several is enough to refuse: which one a request uses is not ours to pick.
        raise TargetRefused(f"{host} resolves to a private, loopback or reserved address ({refused[0]}); "
                            "webhooks only go to public addresses.")
    return Target(url=url, host=host, address=str(addresses[0]))
