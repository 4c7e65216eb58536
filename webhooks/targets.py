"""Where a webhook may point: https to a public address (no SSRF into our own network).

A URL is checked when an endpoint is registered and again before every delivery, and the request
is then sent to the very address that was checked (delivery.py pins it), so a name that later
resolves somewhere private (DNS rebinding) is refused rather than followed. Redirects are never
followed. Plain http, and loopback addresses, are allowed only for 127.0.0.1/localhost receivers
when settings.DEBUG or settings.WEBHOOKS_ALLOW_LOOPBACK_HTTP is on (development and the tests).
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


def _allowed(address: IPAddress, *, loopback_ok: bool) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback:
        return loopback_ok
    return address.is_global and not address.is_multicast


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
    refused = [address for address in addresses if not _allowed(address, loopback_ok=loopback_ok)]
    if refused:
        # One private address among several is enough to refuse: which one a request uses is not ours to pick.
        raise TargetRefused(f"{host} resolves to a private, loopback or reserved address ({refused[0]}); "
                            "webhooks only go to public addresses.")
    return Target(url=url, host=host, address=str(addresses[0]))
