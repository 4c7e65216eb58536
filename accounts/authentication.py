"""DRF authentication: `Authorization: Bearer <knl_sk_ API key | JWT access token>`.

Both credential forms are accepted on every authenticated endpoint (docs/kernle-protocol.md §2.1);
they are told apart by the `knl_sk_` prefix. `request.user` is the acting user and
`request.auth` the `Principal` every access decision is made from.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from rest_framework import authentication
from rest_framework.request import Request
from rest_framework_simplejwt.exceptions import TokenError
from rest_framework_simplejwt.tokens import AccessToken

from accounts.models import ApiKey, Membership, User
from accounts.principal import Principal
from accounts.selectors import API_KEY_PREFIX, api_key_for_secret, principal_for_session
from memoryhub.errors import NotAuthenticated

LAST_USED_RESOLUTION_SECONDS = 60  # write last_used_at at most once a minute per key


def principal_for_key(key: ApiKey, *, credential_id: str | None = None) -> Principal:
    return Principal(
        user=key.user,
        organization=key.organization,
        api_key=key,
        bound_stack_id=key.stack_id,
        read_only=key.read_only,
        role=Membership.Role.ADMIN,
        credential_id=credential_id or key.public_id,
    )


def access_token_for_key(key: ApiKey) -> AccessToken:
    """A short-lived JWT acting as the key (same user, stack binding and read-only flag)."""
    token = AccessToken()
    token["user_id"] = key.user.public_id
    token["sub"] = key.user.public_id
    token["key_id"] = key.public_id
    token["stack_id"] = key.stack.slug if key.stack_id and key.stack else None
    return token


def access_token_lifetime_seconds(token: Any) -> int:
    """The `expires_in` kernle's auth responses carry: seconds from issue to expiry."""
    return int(token["exp"]) - int(token["iat"])


def _touch_last_used(key: ApiKey) -> None:
    now = timezone.now()
    if key.last_used_at is None or (now - key.last_used_at).total_seconds() > LAST_USED_RESOLUTION_SECONDS:
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)


class BearerAuthentication(authentication.BaseAuthentication):
    """Authenticates a raw API key or a JWT issued from one; anything malformed is a 401."""

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[User, Principal] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        parts = header.split()
        # Printable ASCII only: a NUL in the credential would otherwise reach the key lookup and
        # fail there as a database error rather than as the 401 it is.
        if len(parts) != 2 or parts[0].lower() != "bearer" or not (parts[1].isascii() and parts[1].isprintable()):
            raise NotAuthenticated("Malformed Authorization header; expected 'Bearer <token>'.",
                                   code="malformed_authorization")
        credential = parts[1]
        if credential.startswith(API_KEY_PREFIX):
            key = api_key_for_secret(credential)
            if key is None:
                raise NotAuthenticated("Invalid API key.", code="invalid_api_key")
            _touch_last_used(key)
            return key.user, principal_for_key(key)
        return self._authenticate_jwt(credential)

    def _authenticate_jwt(self, raw: str) -> tuple[User, Principal]:
        try:
            token: Any = AccessToken(raw)  # type: ignore[arg-type]
        except TokenError:
            raise NotAuthenticated("Invalid or expired token.", code="invalid_token") from None
        key_id = token.get("key_id")
        if not key_id:
            raise NotAuthenticated("Invalid or expired token.", code="invalid_token")
        key = (
            ApiKey.objects.select_related("organization", "user", "stack")
            .filter(public_id=key_id, revoked_at__isnull=True)
            .first()
        )
        # A token dies with the key it was issued from (revoked, cycled out or expired).
        if key is None or (key.expires_at is not None and key.expires_at <= timezone.now()):
            raise NotAuthenticated("Invalid or expired token.", code="invalid_token")
        return key.user, principal_for_key(key, credential_id=str(token.get("jti", key.public_id)))

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


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
