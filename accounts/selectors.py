"""Reads that carry a rule: finding a key by its secret, a user's organization."""

from __future__ import annotations

import hashlib
import hmac

from django.conf import settings
from django.utils import timezone

from accounts.models import ApiKey, Membership

API_KEY_PREFIX = "knl_sk_"
KEY_PREFIX_LENGTH = 12  # "knl_sk_" + 5 hex characters: indexed for lookup, shown for display


def api_key_hash(secret: str) -> str:
    """Keyed hash of a key secret. Keys carry 128 random bits, so a fast keyed hash suffices
    (kernle-protocol.md §4.1) and keeps per-request cost low."""
    pepper = getattr(settings, "API_KEY_PEPPER", settings.SECRET_KEY).encode()
    return hmac.new(pepper, secret.encode(), hashlib.sha256).hexdigest()


def api_key_for_secret(secret: str) -> ApiKey | None:
    """The active, unexpired key with this secret, or None. Looked up by prefix, compared in
    constant time."""
    if not secret.startswith(API_KEY_PREFIX) or len(secret) > 200:
        return None
    digest = api_key_hash(secret)
    candidates = ApiKey.objects.select_related("organization", "user", "stack").filter(
        key_prefix=secret[:KEY_PREFIX_LENGTH], revoked_at__isnull=True
    )
    now = timezone.now()
    for key in candidates:
        if hmac.compare_digest(key.key_hash, digest):
            if key.expires_at is not None and key.expires_at <= now:
                return None
            return key
    return None


def membership_for_user(user_id: int) -> Membership | None:
    """The user's membership used for dashboard and session API access (oldest first)."""
    return Membership.objects.select_related("organization").filter(user_id=user_id).order_by("created_at").first()
