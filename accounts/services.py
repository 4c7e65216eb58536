"""Every write about organizations, people and keys."""

from __future__ import annotations

import secrets
from datetime import datetime

from django.db import transaction

from accounts.models import ApiKey, Organization, User
from accounts.selectors import API_KEY_PREFIX, KEY_PREFIX_LENGTH, api_key_hash


def new_api_key_secret() -> str:
    """`knl_sk_` + 32 lowercase hex characters (128 random bits), as the kernle CLI expects."""
    return API_KEY_PREFIX + secrets.token_hex(16)


@transaction.atomic
def api_key_issue(
    *,
    organization: Organization,
    user: User,
    stack_id: int | None = None,
    name: str = "",
    read_only: bool = False,
    expires_at: datetime | None = None,
) -> tuple[ApiKey, str]:
    """Create a key and return it with its secret, which is never stored and never shown again."""
    secret = new_api_key_secret()
    key = ApiKey.objects.create(
        organization=organization,
        user=user,
        stack_id=stack_id,
        name=name,
        key_prefix=secret[:KEY_PREFIX_LENGTH],
        key_hash=api_key_hash(secret),
        read_only=read_only,
        expires_at=expires_at,
    )
    return key, secret
