"""Reads that carry a rule: finding a key by its secret, who may see and manage which keys,
people and audit events."""

from __future__ import annotations

import hashlib
import hmac

from django.conf import settings
from django.db.models import QuerySet
from django.utils import timezone

from accounts.models import ApiKey, AuditEvent, Membership, Organization, User
from accounts.principal import Principal
from memoryhub.errors import Forbidden, NotFound

API_KEY_PREFIX = "knl_sk_"
KEY_PREFIX_LENGTH = 12  # "knl_sk_" + 5 hex characters: indexed for lookup, shown for display


def api_key_hash(secret: str) -> str:
    """Keyed hash of a key secret. Keys carry 128 random bits, so a fast keyed hash suffices
    (docs/kernle-protocol.md §2.1) and keeps per-request cost low."""
    pepper = getattr(settings, "API_KEY_PEPPER", settings.SECRET_KEY).encode()
    return hmac.new(pepper, secret.encode(), hashlib.sha256).hexdigest()


def api_key_for_secret(secret: str) -> ApiKey | None:
    """The active, unexpired key with this secret, or None. Looked up by prefix, compared in
    constant time."""
    if not secret.startswith(API_KEY_PREFIX) or len(secret) > 200 or not secret.isprintable():
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


def principal_for_session(user: User) -> Principal | None:
    """Who a signed-in dashboard user acts as (session API and dashboard pages alike): their
    membership's school and role (`membership_for_user`); None for a user in no school."""
    membership = membership_for_user(user.pk)
    if membership is None:
        return None
    return Principal(user=user, organization=membership.organization, role=membership.role,
                     credential_id=f"session:{user.public_id}")


def email_taken(email: str) -> bool:
    return User.objects.filter(email__iexact=email).exists()


# --- who may manage what ---------------------------------------------------------------------


def may_manage_organization(principal: Principal) -> bool:
    """School admins and writable school (org-wide) keys manage stacks, keys and people."""
    return principal.is_org_wide and not principal.read_only


def ensure_may_manage_organization(principal: Principal) -> None:
    if not may_manage_organization(principal):
        raise Forbidden("Only school admins and school keys may do this.", code="admin_required")


def may_manage_own_keys(principal: Principal) -> bool:
    """The kernle `/auth/keys` routes: the owner of a personal account (whatever key they use —
    the CLI manages keys with the stack-bound key it got at register) or a school manager."""
    if principal.read_only or (principal.api_key is None and principal.role != Membership.Role.ADMIN):
        return False
    return principal.organization.kind == Organization.Kind.PERSONAL or principal.is_org_wide


# --- keys ------------------------------------------------------------------------------------


def keys_visible_to(principal: Principal) -> QuerySet[ApiKey]:
    """Keys the caller may list: a manager sees the organization's; a stack-bound key the keys of
    its stack; a teacher the keys of assigned stacks; a billing user none. In a personal account
    the owner sees every key of the account."""
    keys = ApiKey.objects.filter(organization_id=principal.organization.pk).select_related("stack")
    if principal.organization.kind == Organization.Kind.PERSONAL:
        return keys.filter(user_id=principal.user.pk)
    if principal.api_key is not None:
        if principal.bound_stack_id is not None:
            return keys.filter(stack_id=principal.bound_stack_id)
        return keys
    if principal.role == Membership.Role.ADMIN:
        return keys
    if principal.role == Membership.Role.TEACHER:
        return keys.filter(stack__teacher_assignments__user_id=principal.user.pk)
    return keys.none()


def key_for_principal(principal: Principal, key_id: str) -> ApiKey:
    """A key the caller may see, by public id; 404 for anything else (never a hint it exists)."""
    if "\x00" in key_id or len(key_id) > 40:  # cannot name a key (and NUL cannot reach PostgreSQL)
        raise NotFound("Key not found.", code="key_not_found")
    key = keys_visible_to(principal).select_related("organization", "user").filter(public_id=key_id).first()
    if key is None:
        raise NotFound("Key not found.", code="key_not_found")
    return key


def ensure_may_change_key(principal: Principal, key: ApiKey) -> None:
    """Revoke/cycle a key the caller can see (key_for_principal): a key may always act on itself;
    otherwise read-only keys and (outside a personal account) stack-bound agent keys may not."""
    if principal.api_key is not None and principal.api_key.pk == key.pk:
        return
    if principal.read_only:
        raise Forbidden("This key is read-only.", code="read_only_key")
    if principal.organization.kind == Organization.Kind.PERSONAL:
        return
    if principal.is_stack_bound:
        raise Forbidden("An agent key may only change itself.", code="admin_required")


def key_to_change(principal: Principal, key_id: str) -> ApiKey:
    """The key `key_id` if the caller may see it (else 404) and revoke or cycle it (else 403)."""
    key = key_for_principal(principal, key_id)
    ensure_may_change_key(principal, key)
    return key


# --- people and audit ------------------------------------------------------------------------


def members_visible_to(principal: Principal) -> QuerySet[Membership]:
    if not principal.is_org_wide:
        raise Forbidden("Only school admins and school keys may list members.", code="admin_required")
    return Membership.objects.filter(organization_id=principal.organization.pk).select_related("user")


def audit_events_visible_to(principal: Principal) -> QuerySet[AuditEvent]:
    if not principal.is_org_wide:
        raise Forbidden("Only school admins may read the audit log.", code="admin_required")
    return AuditEvent.objects.filter(organization_id=principal.organization.pk).select_related("actor", "actor_key")
