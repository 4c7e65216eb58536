"""Every write about organizations, people, keys and the audit log."""

from __future__ import annotations

import ipaddress
import secrets
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone
from django.utils.text import slugify

from accounts.models import ApiKey, AuditEvent, Membership, Organization, User
from accounts.principal import Principal
from accounts.selectors import (
    API_KEY_PREFIX,
    KEY_PREFIX_LENGTH,
    api_key_hash,
    email_taken,
    ensure_may_receive_secret_of,
    keys_beyond_issuer_reach,
    user_reaches,
)
from accounts.signals import sessions_ended
from memoryhub.errors import Conflict, InvalidInput, NotFound


def new_api_key_secret() -> str:
    """`knl_sk_` + 32 lowercase hex characters (128 random bits), as the kernle CLI expects."""
    return API_KEY_PREFIX + secrets.token_hex(16)


def _ip_or_none(ip: str | None) -> str | None:
    # The audit column is an IP field; "unknown" or garbage is stored as null, not rejected.
    if not ip:
        return None
    try:
        return str(ipaddress.ip_address(ip))
    except ValueError:
        return None


def audit_record(
    *,
    organization: Organization | None,
    action: str,
    principal: Principal | None = None,
    actor: User | None = None,
    target_type: str = "",
    target_id: str = "",
    ip: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> AuditEvent:
    """Append one audit event. Never pass secrets or memory text in `metadata`."""
    return AuditEvent.objects.create(
        organization=organization,
        actor=actor or (principal.user if principal else None),
        actor_key=principal.api_key if principal else None,
        action=action,
        target_type=target_type,
        target_id=target_id,
        ip=_ip_or_none(ip),
        metadata=metadata or {},
    )


# --- keys -----------------------------------------------------------------------------------


@transaction.atomic
def api_key_issue(
    *,
    organization: Organization,
    user: User,
    stack_id: int | None = None,
    name: str = "",
    read_only: bool = False,
    expires_at: datetime | None = None,
    stack_agent: bool = False,
    issued_by_key: str | None = None,
    principal: Principal | None = None,
    ip: str | None = None,
) -> tuple[ApiKey, str]:
    """Create a key and return it with its secret, which is never stored and never shown again.

    The key acts as `user`, who must reach what it is bound to (selectors.with_issuer_reach): a
    key is never more than its person's access, and dies with it. Whether the *caller* may issue
    it is the view's selector's decision (stacks.selectors.stack_for_new_key).

    What a stack-bound key reads (docs/privacy.md "Keys and the grants"): with `stack_agent` (the
    caller's explicit choice, audited as `key.issued_as_stack_agent`) every memory of its stack, as
    the student's own agent; otherwise what its issuer may read — the school key that issued it
    (`issued_by_key`; by default the calling principal's key, if it is one) or else `user`."""
    if not user_reaches(organization_id=organization.pk, user=user, stack_id=stack_id):
        raise InvalidInput("The key's owner does not have access to what the key would be bound to.",
                           code="owner_lacks_access", fields={"stack_id": ["Not reachable by the key's owner."]})
    if stack_agent and stack_id is None:
        raise InvalidInput("Only a key bound to a stack can be that stack's own agent key.",
                           code="stack_agent_needs_stack", fields={"stack_agent": ["Name the stack (stack_id)."]})
    if issued_by_key is None:
        issued_by_key = principal.api_key.public_id if principal is not None and principal.api_key else ""
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
        stack_agent=stack_agent,
        issued_by_key=issued_by_key,
    )
    actor = user if principal is None else None
    audit_record(
        organization=organization, action="key.issued", principal=principal, actor=actor,
        target_type="api_key", target_id=key.public_id, ip=ip,
        metadata={"name": name, "stack_id": stack_id, "read_only": read_only,
                  "expires_at": expires_at.isoformat() if expires_at else None, "stack_agent": stack_agent,
                  "issued_by_key": issued_by_key or None},
    )
    if stack_agent:
        # Its own event: this key reads every memory of the stack, also those no member of staff
        # may read, so the choice stands out in the log rather than as one flag of `key.issued`.
        audit_record(organization=organization, action="key.issued_as_stack_agent", principal=principal,
                     actor=actor, target_type="api_key", target_id=key.public_id, ip=ip,
                     metadata={"stack_id": stack_id, "name": name})
    return key, secret


def api_key_rehash(*, key: ApiKey, secret: str) -> None:
    """Store `secret`'s hash under the current pepper: the key was found under a previous one
    (a pepper rotation's window, docs/operations.md §4). Idempotent; needs no lock."""
    ApiKey.objects.filter(pk=key.pk, key_hash=key.key_hash).update(key_hash=api_key_hash(secret))


@transaction.atomic
def api_keys_revoke_beyond_reach(*, organization: Organization, user: User, reason: str,
                                 principal: Principal | None = None, ip: str | None = None) -> int:
    """Revoke the user's keys in the organization that their current access no longer covers
    (a teacher unassigned, a role lowered, a member removed): access dies with its grant.
    Call it in the transaction that changed the access. Returns how many keys were revoked."""
    keys = list(keys_beyond_issuer_reach(organization_id=organization.pk, user_id=user.pk).select_for_update(
        of=("self",)))
    now = timezone.now()
    for key in keys:
        ApiKey.objects.filter(pk=key.pk).update(revoked_at=now)
        audit_record(organization=organization, action="key.revoked", principal=principal,
                     target_type="api_key", target_id=key.public_id, ip=ip,
                     metadata={"reason": reason, "user_id": user.public_id})
    return len(keys)


@transaction.atomic
def api_key_revoke(*, key: ApiKey, principal: Principal | None = None, ip: str | None = None) -> ApiKey:
    """Deactivate a key (idempotent). Tokens issued from it die with it (the JWT names the key)."""
    locked = ApiKey.objects.select_for_update().get(pk=key.pk)
    if locked.revoked_at is None:
        locked.revoked_at = timezone.now()
        locked.save(update_fields=["revoked_at"])
        audit_record(organization=locked.organization, action="key.revoked", principal=principal,
                     target_type="api_key", target_id=locked.public_id, ip=ip)
    return locked


@transaction.atomic
def api_key_cycle(*, key: ApiKey, principal: Principal | None = None, ip: str | None = None) -> tuple[ApiKey, str]:
    """Atomically deactivate `key` and issue its replacement (same owner, binding and flags — and
    so the same privacy audience: whether it is the stack's own agent key and which school key, if
    any, issued it). The caller receives the new secret, so it must be allowed to read what the key
    reads (selectors.ensure_may_receive_secret_of)."""
    locked = ApiKey.objects.select_for_update().select_related("organization", "user").get(pk=key.pk)
    if principal is not None:
        ensure_may_receive_secret_of(principal, locked)
    if locked.revoked_at is not None or (locked.expires_at is not None and locked.expires_at <= timezone.now()):
        raise InvalidInput("The key is already inactive and cannot be cycled.", code="key_inactive")
    new_key, secret = api_key_issue(
        organization=locked.organization, user=locked.user, stack_id=locked.stack_id, name=locked.name,
        read_only=locked.read_only, expires_at=locked.expires_at, stack_agent=locked.stack_agent,
        issued_by_key=locked.issued_by_key, principal=principal, ip=ip,
    )
    locked.revoked_at = timezone.now()
    locked.replaced_by = new_key
    locked.save(update_fields=["revoked_at", "replaced_by"])
    audit_record(organization=locked.organization, action="key.cycled", principal=principal,
                 target_type="api_key", target_id=locked.public_id, ip=ip,
                 metadata={"new_key_id": new_key.public_id})
    return new_key, secret


# --- organizations and people ------------------------------------------------------------------


def normalized_email(raw: Any, *, field: str = "email") -> str:
    """A valid email (trimmed) or "" for none; anything else is a 400 naming `field`."""
    if raw is None:
        return ""
    if not isinstance(raw, str):
        raise InvalidInput("Email must be a string.", fields={field: ["Must be a string."]})
    email = raw.strip()
    if not email:
        return ""
    try:
        if len(email) > 254:  # the column's limit (RFC 5321 path length)
            raise ValidationError("too long")
        validate_email(email)
    except ValidationError:
        raise InvalidInput("Invalid email address.", code="invalid_email",
                           fields={field: ["Enter a valid email address."]}) from None
    return email


def _unique_org_slug(base: str) -> str:
    base = (slugify(base) or "org")[:80]
    slug = base
    while Organization.objects.filter(slug=slug).exists():
        slug = f"{base}-{secrets.token_hex(3)}"
    return slug


@transaction.atomic
def organization_create(
    *, name: str, kind: str = Organization.Kind.SCHOOL, slug: str | None = None, tier: str = "free"
) -> Organization:
    name = name.strip()
    if not name:
        raise InvalidInput("Organization name is required.", fields={"name": ["Required."]})
    if slug is not None and Organization.objects.filter(slug=slug).exists():
        raise Conflict("An organization with this slug already exists.", code="organization_exists")
    return Organization.objects.create(name=name[:200], kind=kind, slug=slug or _unique_org_slug(name), tier=tier)


@transaction.atomic
def user_create(*, email: str, username: str | None = None, password: str | None = None,
                first_name: str = "", last_name: str = "") -> User:
    """A user; email unique case-insensitively (409 otherwise). `password` None: unusable."""
    email = normalized_email(email)
    if email and email_taken(email):
        raise Conflict("Email already registered", code="email_taken")
    user = User(username=username or "", email=email, first_name=first_name[:150], last_name=last_name[:150])
    if not user.username:
        # Staff sign in with their email; accounts without one (kernle agents) get their public id.
        user.username = email.lower()[:150] if email else user.public_id
    if User.objects.filter(username=user.username).exists():
        raise Conflict("Username already taken.", code="username_taken", fields={"username": ["Taken."]})
    if password:
        user.set_password(password)
    else:
        user.set_unusable_password()
    try:
        with transaction.atomic():
            user.save()
    except IntegrityError:  # lost a race on the email/username unique constraints
        raise Conflict("Email already registered", code="email_taken") from None
    return user


@transaction.atomic
def membership_add(*, organization: Organization, user: User, role: str, principal: Principal | None = None,
                   ip: str | None = None) -> Membership:
    if role not in Membership.Role.values:
        raise InvalidInput("Unknown role.", fields={"role": [f"One of {', '.join(Membership.Role.values)}."]})
    membership, created = Membership.objects.get_or_create(user=user, organization=organization,
                                                           defaults={"role": role})
    if not created and membership.role != role:
        old_role = membership.role
        membership.role = role
        membership.save(update_fields=["role"])
        audit_record(organization=organization, action="member.role_changed", principal=principal,
                     target_type="user", target_id=user.public_id, ip=ip, metadata={"from": old_role, "to": role})
        # A lowered role takes the keys it no longer covers with it (an admin's school key, …).
        api_keys_revoke_beyond_reach(organization=organization, user=user, reason="role_changed",
                                     principal=principal, ip=ip)
    if created:
        audit_record(organization=organization, action="member.added", principal=principal,
                     target_type="user", target_id=user.public_id, ip=ip, metadata={"role": role})
    return membership


@transaction.atomic
def membership_role_change(*, organization: Organization, user_public_id: str, role: str,
                           principal: Principal | None = None, ip: str | None = None) -> Membership:
    """Give a member of the school another role (audited; keys the new role no longer covers are
    revoked by membership_add). A school keeps at least one admin: lowering the last one is a 409."""
    if role not in Membership.Role.values:
        raise InvalidInput("Unknown role.", fields={"role": [f"One of {', '.join(Membership.Role.values)}."]})
    membership = None
    if "\x00" not in user_public_id and len(user_public_id) <= 32:
        membership = (Membership.objects.select_related("user")
                      .filter(organization=organization, user__public_id=user_public_id).first())
    if membership is None:
        raise NotFound("Member not found.", code="member_not_found")
    if membership.role == Membership.Role.ADMIN and role != Membership.Role.ADMIN:
        # Lock every admin row of the school, so two admins lowering each other at once cannot
        # both see "another admin remains".
        admins = list(Membership.objects.select_for_update().filter(organization=organization,
                                                                    role=Membership.Role.ADMIN))
        if not any(admin.pk != membership.pk for admin in admins):
            raise Conflict("A school keeps at least one admin.", code="last_admin")
    return membership_add(organization=organization, user=membership.user, role=role, principal=principal, ip=ip)


def sessions_end(*, user: User) -> None:
    """End every signed-in session of `user` (on any device): their stored session hash no longer
    matches (User.get_session_auth_hash). They may sign in again; what they reach is decided then."""
    User.objects.filter(pk=user.pk).update(session_epoch=F("session_epoch") + 1)
    sessions_ended.send(sender=User, user=user)


@transaction.atomic
def member_create(*, organization: Organization, email: str, role: str, password: str | None = None,
                  first_name: str = "", last_name: str = "", principal: Principal | None = None,
                  ip: str | None = None) -> tuple[User, str]:
    """An admin creates a person in their school. Returns the user and the initial password
    (the given one, or a generated one shown once)."""
    if not normalized_email(email):
        raise InvalidInput("Email is required.", fields={"email": ["Required."]})
    if role not in Membership.Role.values:
        raise InvalidInput("Unknown role.", fields={"role": [f"One of {', '.join(Membership.Role.values)}."]})
    initial_password = password or secrets.token_urlsafe(12)
    user = user_create(email=email, password=initial_password, first_name=first_name, last_name=last_name)
    membership_add(organization=organization, user=user, role=role, principal=principal, ip=ip)
    return user, initial_password


@transaction.atomic
def school_create(*, name: str, admin_email: str, admin_password: str | None = None,
                  slug: str | None = None) -> tuple[Organization, User, str]:
    """A school with its first admin. Returns the admin's initial password (shown once)."""
    organization = organization_create(name=name, slug=slug, kind=Organization.Kind.SCHOOL)
    user, password = member_create(organization=organization, email=admin_email, role=Membership.Role.ADMIN,
                                   password=admin_password)
    return organization, user, password


def password_changed_record(*, user: User, ip: str | None, via: str) -> None:
    """Audit a password change (`via` "change": signed in; "reset": by an emailed link) in the
    organization the person signs in to."""
    membership = Membership.objects.filter(user=user).order_by("created_at").select_related("organization").first()
    audit_record(organization=membership.organization if membership else None, action="password.changed",
                 actor=user, target_type="user", target_id=user.public_id, ip=ip, metadata={"via": via})


def login_record(*, user: User, ip: str | None, succeeded: bool, via: str,
                 principal: Principal | None = None, locked_for_seconds: int | None = None) -> None:
    """Audit a dashboard or key login in the organization it happened in; a failure that locked
    the account (accounts/views.py) is recorded as `login.locked`."""
    if principal is not None:
        organization: Organization | None = principal.organization
    else:
        membership = Membership.objects.filter(user=user).order_by("created_at").select_related("organization").first()
        organization = membership.organization if membership else None
    action = "login.succeeded" if succeeded else "login.failed"
    metadata: dict[str, Any] = {"via": via}
    if locked_for_seconds is not None:
        action = "login.locked"
        metadata["locked_for_seconds"] = locked_for_seconds
    audit_record(organization=organization, action=action, principal=principal, actor=user, target_type="user",
                 target_id=user.public_id, ip=ip, metadata=metadata)
