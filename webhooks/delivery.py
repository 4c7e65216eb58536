"""One delivery attempt: the signed request and what the receiver answered.

Header format (docs/webhooks.md):

    MemoryHub-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<raw body>")>
    MemoryHub-Event-Id: <change event id, or the delivery id for a test event>
    MemoryHub-Delivery-Attempt: <1, 2, ...>

The timestamp is real wall-clock time (receivers compare it with theirs to refuse replays), and is
signed with the body so neither can be swapped. The request goes to the address `targets` checked
(SNI and Host carry the name, so TLS still verifies the certificate for it); redirects are not
followed; only the status code is read, never the body. Nothing here logs the URL's query, the
secret or the body.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass

import httpx

from webhooks.targets import Target, TargetRefused, target_checked

TIMEOUT_SECONDS = 10.0
USER_AGENT = "MemoryHub-Webhooks/1"


@dataclass(frozen=True)
class Outcome:
    status_code: int | None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def signature_header(secret: str, body: bytes, timestamp: int) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def _pinned_url(target: Target) -> httpx.URL:
    return httpx.URL(target.url).copy_with(host=target.address)


def post(url: str, *, body: bytes, secret: str, event_id: str, attempt: int) -> Outcome:
    """POST the body, signed now, to the checked address of `url`. Never raises for the receiver's failures."""
    try:
        target = target_checked(url)
    except TargetRefused as refused:
        return Outcome(None, f"refused: {refused}"[:200])
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "Host": httpx.URL(target.url).netloc.decode("ascii"),
        "MemoryHub-Signature": signature_header(secret, body, int(time.time())),
        "MemoryHub-Event-Id": event_id,
        "MemoryHub-Delivery-Attempt": str(attempt),
    }
    try:
        with httpx.Client(timeout=TIMEOUT_SECONDS, follow_redirects=False, trust_env=False) as client, \
                client.stream("POST", _pinned_url(target), content=body, headers=headers,
                              extensions={"sni_hostname": target.host}) as response:
            return Outcome(response.status_code, "" if 200 <= response.status_code < 300
                           else f"HTTP {response.status_code}")
    except httpx.TimeoutException:
        return Outcome(None, "timed out")
    except httpx.HTTPError as error:
        return Outcome(None, f"{type(error).__name__}"[:200])
