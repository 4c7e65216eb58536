"""Rate limits backed by Redis: by who is asking, not by address (docs/kernle-protocol.md §2.9).

Each limited action has two throttles with the same scope and rate: one counts per client IP
(`X-Forwarded-For` believed only from `settings.TRUSTED_PROXIES`, see accounts/network.py), one
per credential (API key, JWT's key, or dashboard user), plus the school's share (`SchoolThrottle`).
Attach them through the tuples below, e.g. ``throttle_classes = SYNC_PUSH_THROTTLES``. Every other
API view gets `RequestRateThrottle` and `SchoolThrottle` from REST_FRAMEWORK's defaults.

Who is counted: a request with a valid credential is counted per credential and per school
(organization), never per client IP — many agents and a school's devices share one address (a NAT,
a vendor's servers). A request without one is counted per client IP. The credential-exchange
routes (register, login: `IpThrottledFirstMixin`) always count per IP, before authenticating.

Failed authentications cost too (`FailureLimit`, below): failed Bearer credentials per client IP
and per API-key prefix (accounts/authentication.py), failed dashboard sign-ins per account name
and per IP (accounts/views.py); past a limit the identity is blocked with back-off.

Counting is a fixed window: one INCR per request that also sets the window's expiry when it
creates it (one Lua script, one round trip, O(1) in Redis, unlike DRF's pickled timestamp lists).
FAIL CLOSED: nothing here catches cache errors — an unreachable Redis raises, and the API error
handler answers 503 with Retry-After; a request is never let through unmetered.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.cache import cache
from rest_framework.request import Request
from rest_framework.settings import api_settings
from rest_framework.throttling import BaseThrottle

from accounts.network import client_ip
from accounts.principal import Principal
from accounts.tiers import tier_for

KEY_NAMESPACE = "throttle"
_PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

# Where the windows read the time: the wall clock. A module attribute, looked up on every request,
# so tests can pin it (tests/conftest.py `throttle_clock`) — otherwise a burst that straddles a
# window boundary on a slow run is counted in two windows and a limit test flakes.
clock: Callable[[], float] = time.time


def parse_rate(rate: str) -> tuple[int, int]:
    """"5/min" → (5, 60)."""
    count, period = rate.split("/")
    return int(count), _PERIODS[period.strip()[0]]


def redis_client(*, write: bool = False) -> Any:
    """The Django cache's Redis connection as a redis-py client, made once per cache connection pool.

    WHY: Django's RedisCacheClient.get_client builds a new `redis.Redis` on every
    call, and each one copies redis-py's table of ~90 response callbacks into a fresh case-folding
    dict — two or three times per API request here (the back-off read, the rate window), for
    nothing: a redis-py client is thread-safe and only borrows connections from the pool. Kept on
    the cache's own client object (one per thread's cache handle), so it lives and dies with its pool.
    """
    backend = cache._cache  # type: ignore[attr-defined]
    pool = backend._get_connection_pool(write)
    clients: dict[int, Any] = backend.__dict__.setdefault("_memoryhub_clients", {})
    client = clients.get(id(pool))
    if client is None or client.connection_pool is not pool:
        client = clients[id(pool)] = backend.get_client(write=write)
    return client


# INCR, and give the window its expiry when this hit created it: atomic in Redis, one command.
# WHY a script: the same as a MULTI of SET-NX-EX + INCR, for less of the client's CPU and a shorter
# round trip (four commands and replies to pack and parse become one).
_WINDOW_HIT_LUA = ("local n = redis.call('INCR', KEYS[1]) "
                   "if n == 1 then redis.call('EXPIRE', KEYS[1], ARGV[1]) end return n")
_window_hit_script: Any = None


def _window_hit(key: str, *, ttl: int) -> int:
    """Count one hit in a window (created with its expiry on the first hit), in one round trip.
    Uses the Django cache's Redis client so keys share its prefix (throttle_state_clear). redis-py
    loads the script again by itself if Redis restarted without it (NOSCRIPT)."""
    global _window_hit_script
    full_key = cache.make_and_validate_key(key)
    client = redis_client(write=True)
    if _window_hit_script is None:
        _window_hit_script = client.register_script(_WINDOW_HIT_LUA)
    return int(_window_hit_script(keys=[full_key], args=[ttl], client=client))


class _WindowThrottle(BaseThrottle):
    scope = ""

    def __init__(self) -> None:
        self._wait: float | None = None

    def identity(self, request: Request) -> str | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def rate(self) -> tuple[int, int]:
        # Read at call time (not import time) so settings overrides apply.
        return parse_rate(str(api_settings.DEFAULT_THROTTLE_RATES[self.scope]))

    def allow_request(self, request: Request, view: Any) -> bool:
        ident = self.identity(request)
        if ident is None:
            return True
        return self.hit(ident)

    def hit(self, ident: str, rate: tuple[int, int] | None = None) -> bool:
        """Count one request of `ident` in this scope's window (`rate`: (limit, period), default
        the scope's); False, and `wait()` set, past the limit."""
        limit, period = rate or self.rate()
        now = clock()
        window = int(now // period)
        count = _window_hit(f"{KEY_NAMESPACE}:{self.scope}:{ident}:{window}", ttl=period + 1)
        if count <= limit:
            return True
        self._wait = (window + 1) * period - now
        return False

    def wait(self) -> float | None:
        return self._wait


def ip_identity(request: Request) -> str:
    return f"ip:{client_ip(request)}"


def credential_identity(request: Request) -> str | None:
    principal = request.auth
    if not isinstance(principal, Principal):
        return None  # unauthenticated: the IP throttle of the same scope counts it
    if principal.api_key is not None:
        return f"key:{principal.api_key.public_id}"
    return f"user:{principal.user.public_id}"


class ClientIpThrottle(_WindowThrottle):
    """Per client IP, for requests without a valid credential only: an authenticated caller is
    counted by its credential and its school instead (sharing an address costs nothing)."""

    def identity(self, request: Request) -> str | None:
        if isinstance(request.auth, Principal):
            return None
        return ip_identity(request)


class CredentialThrottle(_WindowThrottle):
    def identity(self, request: Request) -> str | None:
        return credential_identity(request)


class RequestRateThrottle(_WindowThrottle):
    """The default on every API view: per credential when authenticated, else per IP. Its real
    job besides abuse protection is failing closed — every authenticated request reads Redis."""

    scope = "request"

    def identity(self, request: Request) -> str | None:
        return credential_identity(request) or ip_identity(request)


class SchoolThrottle(_WindowThrottle):
    """A school's share of the service: every authenticated request of one organization (all its
    keys, tokens and dashboard users) in one window, at `settings.THROTTLE_SCHOOL_RATE` times its
    plan's `request_share` (accounts/tiers.py; None: not limited). Scope "school".
    Unauthenticated requests are not counted here (their IP is)."""

    scope = "school"

    def allow_request(self, request: Request, view: Any) -> bool:
        principal = request.auth
        if not isinstance(principal, Principal):
            return True
        share = tier_for(principal.organization).request_share
        if share is None:
            return True
        limit, period = self.rate()
        return self.hit(f"org:{principal.organization.pk}", (limit * share, period))

    def rate(self) -> tuple[int, int]:
        return parse_rate(str(settings.THROTTLE_SCHOOL_RATE))


def _pair(scope: str) -> tuple[type[BaseThrottle], type[BaseThrottle], type[BaseThrottle]]:
    """The per-IP and per-credential throttles of `scope`, and the school's share."""
    ip = type(f"{scope.title().replace('_', '')}IpThrottle", (ClientIpThrottle,), {"scope": scope,
                                                                                   "__module__": __name__})
    credential = type(f"{scope.title().replace('_', '')}CredentialThrottle", (CredentialThrottle,),
                      {"scope": scope, "__module__": __name__})
    return ip, credential, SchoolThrottle


REGISTER_THROTTLES = _pair("register")
LOGIN_THROTTLES = _pair("login")
KEY_CREATE_THROTTLES = _pair("key_create")  # POST /auth/keys, cycle, native key issue
SYNC_PUSH_THROTTLES = _pair("sync_push")
SYNC_PULL_THROTTLES = _pair("sync_pull")
# billing.api: each subscription change has its own limit (§12.3: "5/min each").
SUBSCRIPTION_UPGRADE_THROTTLES = _pair("subscription_upgrade")
SUBSCRIPTION_DOWNGRADE_THROTTLES = _pair("subscription_downgrade")
SUBSCRIPTION_CANCEL_THROTTLES = _pair("subscription_cancel")
SUBSCRIPTION_REACTIVATE_THROTTLES = _pair("subscription_reactivate")
PAYMENT_CONFIRM_THROTTLES = _pair("payment_confirm")
WALLET_LINK_THROTTLES = _pair("wallet_link")


# --- what failed authentications cost ------------------------------------------------------------


@dataclass(frozen=True)
class FailureLimit:
    """`limit` failures of one identity within a `period`-second window block it for `block`
    seconds; each further block within a day doubles, up to `MAX_BLOCK_SECONDS` (back-off).
    Rates: settings.AUTH_FAILURE_LIMITS, read at call time so tests may override them."""

    scope: str  # "bearer_ip", "bearer_prefix", "login_account", "login_ip"

    def rate(self) -> tuple[int, int, int]:
        limit, period, block = settings.AUTH_FAILURE_LIMITS[self.scope]
        return int(limit), int(period), int(block)

    def _key(self, ident: str, part: str) -> str:
        # Under KEY_NAMESPACE, so throttle_state_clear lifts lockouts too.
        return cache.make_and_validate_key(f"{KEY_NAMESPACE}:fail:{self.scope}:{ident}:{part}")

    def blocked_for(self, ident: str) -> float | None:
        """Seconds until `ident` may try again, or None when it is not blocked (one Redis GET)."""
        key = self._key(ident, "block")
        until = redis_client().get(key)
        if until is None:
            return None
        remaining = float(until) - clock()
        return remaining if remaining > 0 else None

    def blocked_for_and_read(self, ident: str, other_key: str) -> tuple[float | None, bytes | None]:
        """`blocked_for(ident)` and the raw value of `other_key`, in the same single round trip
        (accounts.authentication reads the API-key cache generation with it: accounts/key_cache.py)."""
        key = self._key(ident, "block")
        until, other = redis_client().mget([key, other_key])
        if until is None:
            return None, other
        remaining = float(until) - clock()
        return (remaining if remaining > 0 else None), other

    def record(self, ident: str) -> float | None:
        """Count one failure; returns the block's length in seconds when this failure starts one."""
        limit, period, block = self.rate()
        now = clock()
        window = int(now // period)
        count_key = self._key(f"{ident}:{window}", "count")
        client = redis_client(write=True)
        pipe = client.pipeline(transaction=True)
        pipe.set(count_key, 0, ex=period + 1, nx=True)
        pipe.incr(count_key)
        _, count = pipe.execute()
        if int(count) != limit:  # block once per window, when the limit is reached
            return None
        strikes_key = self._key(ident, "strikes")
        pipe = client.pipeline(transaction=True)
        pipe.incr(strikes_key)
        pipe.expire(strikes_key, STRIKE_MEMORY_SECONDS)
        strikes, _ = pipe.execute()
        seconds = min(block * 2 ** (int(strikes) - 1), MAX_BLOCK_SECONDS)
        client.set(self._key(ident, "block"), now + seconds, ex=int(seconds) + 1)
        return float(seconds)

    def clear(self, ident: str) -> None:
        """Forget `ident`'s failures in the current window (a successful sign-in)."""
        _, period, _ = self.rate()
        redis_client(write=True).delete(
            self._key(f"{ident}:{int(clock() // period)}", "count"))


MAX_BLOCK_SECONDS = 3600
STRIKE_MEMORY_SECONDS = 86400  # a block within a day of the previous one lasts twice as long
BEARER_IP_FAILURES = FailureLimit("bearer_ip")
BEARER_PREFIX_FAILURES = FailureLimit("bearer_prefix")
LOGIN_ACCOUNT_FAILURES = FailureLimit("login_account")
LOGIN_IP_FAILURES = FailureLimit("login_ip")


def throttle_state_clear() -> int:
    """Forget every throttle counter (tests; an operator lifting a lockout). Returns keys removed."""
    client = cache._cache.get_client(write=True)  # type: ignore[attr-defined]
    removed = 0
    for key in client.scan_iter(match=cache.make_key(f"{KEY_NAMESPACE}:*"), count=500):
        removed += int(client.delete(key))
    return removed


class IpThrottledFirstMixin:
    """Counts the per-IP throttles BEFORE authenticating, so failed credentials are limited too
    (DRF would authenticate first and never count a request that fails authentication)."""

    # (A mixin for APIViews. Its docstring is the OpenAPI description of the views using it.)
    # Only the credential-exchange routes (register, login) use it: there the address is counted
    # whatever the credential, as before authenticating none is known.

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        for throttle in self.get_throttles():  # type: ignore[attr-defined]
            if isinstance(throttle, ClientIpThrottle) and not throttle.hit(ip_identity(request)):
                self.throttled(request, throttle.wait())  # type: ignore[attr-defined]
        super().initial(request, *args, **kwargs)  # type: ignore[misc]

    def check_throttles(self, request: Request) -> None:
        for throttle in self.get_throttles():  # type: ignore[attr-defined]
            if not isinstance(throttle, ClientIpThrottle) and not throttle.allow_request(request, self):
                self.throttled(request, throttle.wait())  # type: ignore[attr-defined]
