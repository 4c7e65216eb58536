"""DRF authentication: `Authorization: Bearer <knl_sk_ API key | JWT access token>`.

Both credential forms are accepted on every authenticated endpoint (docs/kernle-protocol.md §2.1);
they are told apart by the `knl_sk_` prefix. `request.user` is the acting user and
`request.auth` the `Principal` every access decision is made from.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user
from django.http import HttpRequest
from django.utils import timezone
from rest_framework import authentication
from rest_framework.exceptions import Throttled
from rest_framework.request import Request
from rest_framework_simplejwt.exceptions import TokenError
from rest_framework_simplejwt.tokens import AccessToken

from accounts import key_cache
from accounts.models import ApiKey, Membership, User
from accounts.network import client_ip
from accounts.principal import Principal
from accounts.selectors import (
    API_KEY_PREFIX,
    KEY_PREFIX_LENGTH,
    api_key_for_secret,
    api_key_for_token,
    api_key_hash,
    issuer_role_of,
    plausible_key_id,
    principal_for_session,
)
from accounts.services import api_key_rehash
from accounts.throttles import BEARER_IP_FAILURES, BEARER_PREFIX_FAILURES
from accounts.token_claims import verified_claims
from memoryhub.errors import NotAuthenticated

LAST_USED_RESOLUTION_SECONDS = 60  # write last_used_at at most once a minute per key


def principal_for_key(key: ApiKey, *, credential_id: str | None = None) -> Principal:
    # `role`: the current role of the person the key acts as (memories.privacy.grants reads it for a key
    # that is not its stack's own agent key). A key is only found while that person still reaches
    # what it is bound to, so they hold a role here; the fallback is the least of them.
    return Principal(
        user=key.user,
        organization=key.organization,
        api_key=key,
        bound_stack_id=key.stack_id,
        read_only=key.read_only,
        role=issuer_role_of(key) or Membership.Role.BILLING,
        credential_id=credential_id or key.public_id,
    )


def _bound_claims(key: ApiKey) -> dict[str, Any]:
    """What a token is bound to at issue: its key and that key's person, organization, stack and
    scope. On use every one must still match the key the token names, or it is refused."""
    return {
        "user_id": key.user.public_id,
        "sub": key.user.public_id,
        "key_id": key.public_id,
        "org_id": key.organization.public_id,
        "stack_id": key.stack.slug if key.stack_id and key.stack else None,
        "read_only": key.read_only,
    }


def access_token_for_key(key: ApiKey) -> AccessToken:
    """A JWT acting as the key (same user, organization, stack binding and read-only flag),
    signed with the JWT signing key (settings.JWT_SIGNING_KEY, never SECRET_KEY)."""
    token = AccessToken()
    for claim, value in _bound_claims(key).items():
        token[claim] = value
    return token


def access_token_lifetime_seconds(token: Any) -> int:
    """The `expires_in` kernle's auth responses carry: seconds from issue to expiry."""
    return int(token["exp"]) - int(token["iat"])


def _touch_last_used(key: ApiKey) -> bool:
    """Write last_used_at when it is over a minute old; True when it wrote (and set it on `key`)."""
    now = timezone.now()
    if key.last_used_at is None or (now - key.last_used_at).total_seconds() > LAST_USED_RESOLUTION_SECONDS:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        key.last_used_at = now
        return True
    return False


def _refused_by_back_off(seconds: float) -> Throttled:
    return Throttled(wait=seconds, detail="Too many failed authentications from here; try again later.")


class BearerAuthentication(authentication.BaseAuthentication):
    """Authenticates a raw API key or a JWT issued from one; anything malformed is a 401.

    Guessing costs (accounts/throttles.py FailureLimit; docs/operations.md §5): every failed Bearer
    credential counts against the client IP, and a failed API key also against its 12-character
    prefix. Past either limit, failing credentials get 429 + Retry-After instead of 401, while a
    credential that verifies is always served: nobody can lock a key out by knowing its prefix,
    and one broken client behind a school's NAT cannot lock out every agent at that address.
    """

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[User, Principal] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        ip = client_ip(request)
        # One Redis round trip: this address's back-off and the API-key cache's generation.
        blocked, generation = BEARER_IP_FAILURES.blocked_for_and_read(ip, key_cache.generation_key())
        try:
            return self._authenticate(header, generation)
        except (NotAuthenticated, Throttled):  # (a Throttled here is a prefix's back-off)
            # WHY the credential is checked even while its address is blocked: the back-off is
            # one address's, and a school's NAT or a vendor's egress is many clients. A blocked
            # address's failures are not counted again (the block already answers them).
            if blocked is not None:
                raise _refused_by_back_off(blocked) from None
            BEARER_IP_FAILURES.record(ip)
            raise

    def _authenticate(self, header: str, generation: bytes | None = None) -> tuple[User, Principal]:
        parts = header.split()
        # Printable ASCII only: a NUL in the credential would otherwise reach the key lookup and
        # fail there as a database error rather than as the 401 it is.
        if len(parts) != 2 or parts[0].lower() != "bearer" or not (parts[1].isascii() and parts[1].isprintable()):
            raise NotAuthenticated("Malformed Authorization header; expected 'Bearer <token>'.",
                                   code="malformed_authorization")
        credential = parts[1]
        if credential.startswith(API_KEY_PREFIX):
            return self._authenticate_key(credential, generation)
        return self._authenticate_jwt(credential, generation)

    def _authenticate_key(self, secret: str, generation: bytes | None) -> tuple[User, Principal]:
        digest = api_key_hash(secret)
        match = key_cache.lookup(digest, generation)
        if match is not None:  # verified a moment ago, nothing changed since (accounts/key_cache.py)
            if _touch_last_used(match.key):
                key_cache.note_used(digest, match.key.last_used_at)
            return match.key.user, principal_for_key(match.key)
        match = api_key_for_secret(secret)
        if match is None or not match.issuer_reaches:
            prefix = secret[:KEY_PREFIX_LENGTH]
            BEARER_PREFIX_FAILURES.record(prefix)
            blocked = BEARER_PREFIX_FAILURES.blocked_for(prefix)
            if blocked is not None:
                raise _refused_by_back_off(blocked)
            if match is None:
                raise NotAuthenticated("Invalid API key.", code="invalid_api_key")
            raise _access_ended()
        if match.stale_hash:
            api_key_rehash(key=match.key, secret=secret)
        _touch_last_used(match.key)
        key_cache.remember(digest, generation, match)
        return match.key.user, principal_for_key(match.key)

    def _authenticate_jwt(self, raw: str, generation: bytes | None = None) -> tuple[User, Principal]:
        try:
            token = verified_claims(raw)  # remembered once verified (accounts/token_claims.py)
        except TokenError:
            raise NotAuthenticated("Invalid or expired token.", code="invalid_token") from None
        key_id: Any = token.get("key_id")
        # The key a token names is remembered by its id, under the same rules as a key's secret
        # (accounts/key_cache.py); the token's own claims are checked against it on every use.
        entry = key_cache.token_entry(key_id) if plausible_key_id(key_id) else None
        match = key_cache.lookup(entry, generation) if entry is not None else None
        if match is None:
            match = api_key_for_token(key_id)
            if match is not None and entry is not None:
                key_cache.remember(entry, generation, match)
        # A token dies with the key it was issued from (revoked, cycled out or expired), and is
        # refused when any claim it was bound to at issue no longer matches that key.
        if match is None or any(token.get(claim) != value for claim, value in _bound_claims(match.key).items()):
            raise NotAuthenticated("Invalid or expired token.", code="invalid_token")
        if not match.issuer_reaches:
            raise _access_ended()
        return match.key.user, principal_for_key(match.key, credential_id=str(token.get("jti", match.key.public_id)))

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


def _access_ended() -> NotAuthenticated:
    return NotAuthenticated("This key no longer grants access: whoever it was issued for lost access to what "
                            "it is bound to.", code="key_access_ended")


class SessionPrincipalAuthentication(authentication.SessionAuthentication):
    """Dashboard sessions (with CSRF) on the native API, with the user's membership as Principal."""

    def authenticate(self, request: Request) -> tuple[User, Principal] | None:
        result = super().authenticate(request)
        if result is None:
            return None
        user = result[0]
        principal = principal_for_session(user)
        if principal is None:
            return None
        return user, principal


def request_credential_verifies(request: HttpRequest) -> bool:
    """Does `request` carry a credential that authenticates: a signed-in session, or a Bearer
    credential the API would accept? Reads only the headers and the client address (the body is
    not read yet): the edge's body limit asks it before letting a request send more than a
    stranger may (memoryhub/limits.py; docs/kernle-protocol.md §7.3), since a credential merely
    present proves nothing. The Bearer check is BearerAuthentication itself, so a failing
    credential costs here what it costs on the API (the failure limits count it; past them it
    is refused) and a verified key is remembered for the request's own authentication."""
    session_key = request.COOKIES.get(settings.SESSION_COOKIE_NAME)
    if session_key:
        request.session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
        if get_user(request).is_authenticated:  # the session exists and its user still matches it
            return True
    if not request.META.get("HTTP_AUTHORIZATION"):
        return False
    try:
        return BearerAuthentication().authenticate(Request(request)) is not None
    except (NotAuthenticated, Throttled):
        return False
