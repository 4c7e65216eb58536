"""The claims of access tokens this process has verified, remembered until the token expires.

WHY: kernle's client sends its access token on every sync, and verifying one (PyJWT's checks of
each segment's characters, the HMAC, the claims) was the largest single step of a pull's
authentication (docs/operations.md §5 "Token claims").

Why this stays safe:
* A token's claims are a function of its bytes, the signing key (fixed for a process's life) and
  the clock. Only a token that verified is remembered, and its expiry is checked again on every
  use: an expired token is refused as it would be unremembered.
* What a token grants is still decided on every request from the key it names
  (accounts/key_cache.py's rules): revoking, cycling or narrowing that key ends the token at once,
  remembered or not.
* Keyed by a digest of the token, never the token itself; bounded (past MAX_ENTRIES the table
  starts again), and each caller gets a read-only view of the claims.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from rest_framework_simplejwt.tokens import AccessToken

MAX_ENTRIES = 10_000  # tokens in use per process at once; past it the table starts again

_claims: dict[bytes, Mapping[str, Any]] = {}
_lock = threading.Lock()


def verified_claims(raw: str) -> Mapping[str, Any]:
    """The claims of access token `raw`, read-only. Raises simplejwt's TokenError for a token that
    does not verify or has expired, as `AccessToken(raw)` does."""
    digest = hashlib.blake2b(raw.encode(), digest_size=32).digest()
    claims = _claims.get(digest)
    if claims is not None and claims.get("exp", 0) > time.time():
        return claims
    # Raises TokenError, also for an expired token or one without an expiry (simplejwt requires it).
    token: Any = AccessToken(raw)  # type: ignore[arg-type]
    claims = MappingProxyType(dict(token.payload))
    with _lock:
        if len(_claims) >= MAX_ENTRIES:
            _claims.clear()
        _claims[digest] = claims
    return claims


def forget_all() -> None:
    """Drop every remembered token (tests; a process never needs to: see the module docstring)."""
    with _lock:
        _claims.clear()
