"""Reads that carry a rule: finding a key by its secret (under the current or a previous pepper)
and whether the person it acts as still reaches what it is bound to, who may see and manage which
keys, people and audit events."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import connection
from django.db.models import BooleanField, CharField, Q, QuerySet
from django.db.models.expressions import RawSQL
from django.utils import timezone

from accounts.models import ApiKey, AuditEvent, Membership, Organization, User
from accounts.principal import Principal
from memoryhub.database import ModelRows
from memoryhub.errors import Forbidden, NotFound
from memoryhub.replica import read_alias

API_KEY_PREFIX = "knl_sk_"
KEY_PREFIX_LENGTH = 12  # "knl_sk_" + 5 hex characters: indexed for lookup, shown for display


def api_key_hash(secret: str, *, pepper: str | None = None) -> str:
    """Keyed hash of a key secret under the current pepper (or `pepper`). Keys carry 128 random
    bits, so a fast keyed hash suffices (docs/kernle-protocol.md §2.1) and keeps per-request cost
    low. The pepper is its own secret, not SECRET_KEY (memoryhub/secrets.py), so rotating either
    leaves the other's uses alone."""
    key = (pepper if pepper is not None else settings.API_KEY_PEPPER).encode()
    return hmac.new(key, secret.encode(), hashlib.sha256).hexdigest()


def with_issuer_reach(keys: QuerySet[ApiKey]) -> QuerySet[ApiKey]:
    """Annotate `issuer_reaches`: does the person a key acts as (its `user`, who issued it or for
    whom it was issued) still reach what the key is bound to? An admin of the key's organization
    reaches every stack and the whole school; a teacher reaches a stack assigned to them; anyone
    else — a billing user, a teacher for a school key, someone who left — nothing.

    Access dies with its grant: a key is never more than its issuer's current access, whatever
    path changed that access (the services also revoke such keys, but the Django admin or a
    direct write would not). It is evaluated inside the key's own lookup query — one probe of the
    (user, organization) membership index and at most one of the (user, stack) assignment index —
    so it costs no extra round trip and has no cache to keep in step with role changes."""
    return keys.annotate(issuer_reaches=_issuer_reaches())


# Raw SQL on purpose: the same condition as nested ORM Exists() is costly to compile in Python, and
# it is compiled on every authenticated request. Tables: accounts.ApiKey ("accounts_apikey", the outer query's),
# accounts.Membership, and stacks.TeacherAssignment named by its table (accounts sits below stacks
# and imports none of its models); tests/accounts/test_security.py and the isolation matrix
# exercise every branch, so a renamed table fails them.
_ISSUER_REACHES_SQL = (
    'EXISTS (SELECT 1 FROM "accounts_membership" m'
    ' WHERE m.user_id = "accounts_apikey".user_id AND m.organization_id = "accounts_apikey".organization_id'
    ' AND (m.role = %s OR (m.role = %s AND "accounts_apikey".stack_id IS NOT NULL'
    ' AND EXISTS (SELECT 1 FROM "stacks_teacherassignment" a'
    ' WHERE a.user_id = "accounts_apikey".user_id AND a.stack_id = "accounts_apikey".stack_id))))'
)


def _issuer_reaches() -> RawSQL:
    return RawSQL(_ISSUER_REACHES_SQL, (Membership.Role.ADMIN.value, Membership.Role.TEACHER.value),  # noqa: S611 - constant SQL, bound parameters
                  output_field=BooleanField())


# The current role of the person a key acts as, in the key's school ((user, organization) is unique:
# one probe of the same index as above). A stack-bound key that is not the stack's own agent key
# answers to it in the privacy grants (`role:<role>`, memories.privacy.grants), so a lowered role narrows
# what the key reads at once.
_ISSUER_ROLE_SQL = (
    '(SELECT m.role FROM "accounts_membership" m'
    ' WHERE m.user_id = "accounts_apikey".user_id AND m.organization_id = "accounts_apikey".organization_id)'
)


def with_issuer_role(keys: QuerySet[ApiKey]) -> QuerySet[ApiKey]:
    """Annotate `issuer_role`: the key's person's current role in its school (None: none)."""
    return keys.annotate(issuer_role=RawSQL(_ISSUER_ROLE_SQL, (), output_field=CharField()))  # noqa: S611 - constant SQL


def issuer_role_of(key: ApiKey) -> str | None:
    """The current role of the person `key` acts as: the annotation when the key was found by
    authentication (`_live_keys`), else read now."""
    if hasattr(key, "issuer_role"):
        return str(key.issuer_role) if key.issuer_role is not None else None
    return (Membership.objects.filter(organization_id=key.organization_id, user_id=key.user_id)
            .values_list("role", flat=True).first())


def user_reaches(*, organization_id: int, user: User, stack_id: int | None) -> bool:
    """Would a key of `user` bound to `stack_id` (None: the whole school) be within their reach?
    The rule of `_ISSUER_REACHES_SQL`, for a key not issued yet (accounts.services.api_key_issue)."""
    membership = Membership.objects.filter(organization_id=organization_id, user=user).first()
    if membership is None:
        return False
    if membership.role == Membership.Role.ADMIN:
        return True
    return (membership.role == Membership.Role.TEACHER and stack_id is not None
            and user.stack_assignments.filter(stack_id=stack_id).exists())


@dataclass(frozen=True)
class KeyMatch:
    """An active, unexpired key found by its secret or id."""

    key: ApiKey
    issuer_reaches: bool  # False: the key's issuer lost the access it was issued under
    stale_hash: bool = False  # found under a previous pepper: store the current pepper's hash


def _live_keys() -> QuerySet[ApiKey]:
    return with_issuer_role(with_issuer_reach(ApiKey.objects.select_related("organization", "user", "stack")
                                              .filter(revoked_at__isnull=True)))


def _unexpired(key: ApiKey) -> bool:
    return key.expires_at is None or key.expires_at > timezone.now()


def api_key_for_secret(secret: str) -> KeyMatch | None:
    """The active, unexpired key with this secret, or None. Looked up by prefix, compared in
    constant time, under the current pepper and then under each previous one (a pepper rotation's
    window, docs/operations.md §4)."""
    if not secret.startswith(API_KEY_PREFIX) or len(secret) > 200 or not secret.isprintable():
        return None
    peppers = [settings.API_KEY_PEPPER, *settings.API_KEY_PEPPERS_PREVIOUS]
    digests = [api_key_hash(secret, pepper=pepper) for pepper in peppers]
    for key in _live_keys().filter(key_prefix=secret[:KEY_PREFIX_LENGTH]):
        for index, digest in enumerate(digests):
            if hmac.compare_digest(key.key_hash, digest):
                if not _unexpired(key):
                    return None
                return KeyMatch(key=key, issuer_reaches=bool(key.issuer_reaches),  # type: ignore[attr-defined]
                                stale_hash=index > 0)
    return None


def api_key_for_token(key_id: str) -> KeyMatch | None:
    """The active, unexpired key an access token names, or None (a token dies with its key)."""
    if not plausible_key_id(key_id):
        return None
    key = _live_keys().filter(public_id=key_id).first()
    if key is None or not _unexpired(key):
        return None
    return KeyMatch(key=key, issuer_reaches=bool(key.issuer_reaches))  # type: ignore[attr-defined]


def plausible_key_id(value: object) -> bool:
    """Could `value` name a key at all? (NUL cannot even reach PostgreSQL.)"""
    return isinstance(value, str) and 0 < len(value) <= 40 and "\x00" not in value


def keys_beyond_issuer_reach(*, organization_id: int, user_id: int) -> QuerySet[ApiKey]:
    """The user's active keys in the organization that their current access no longer covers."""
    return ApiKey.objects.filter(organization_id=organization_id, user_id=user_id,
                                 revoked_at__isnull=True).filter(~_issuer_reaches())


def keys_maybe_under_previous_pepper(rotated_at: datetime) -> QuerySet[ApiKey]:
    """Active keys that may still carry a hash under a pepper rotated out at `rotated_at`: issued
    before it and not used since (a key used since was re-hashed on that use; last_used_at is
    written at most once a minute, so this errs towards listing a key)."""
    return ApiKey.objects.filter(revoked_at__isnull=True, created_at__lt=rotated_at).filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now())).filter(
        Q(last_used_at__isnull=True) | Q(last_used_at__lt=rotated_at))


_MEMBERSHIP_ROWS = ModelRows(Membership, table_alias="m")
_ORGANIZATION_ROWS = ModelRows(Organization, table_alias="o")
# Every dashboard page, session API call and live page message asks it first. Written out once, so
# that none of them builds and compiles the queryset (docs/architecture.md §7.2); only the models'
# own table and column names are interpolated. tests/accounts/test_selectors.py holds it to the
# queryset's answer.
_MEMBERSHIP_SQL = (
    f"SELECT {_MEMBERSHIP_ROWS.columns}, {_ORGANIZATION_ROWS.columns}"  # noqa: S608
    f" FROM {_MEMBERSHIP_ROWS.table} JOIN {_ORGANIZATION_ROWS.table} ON o.id = m.organization_id"
    " WHERE m.user_id = %s ORDER BY m.created_at, m.id LIMIT 1")


def membership_for_user(user_id: int) -> Membership | None:
    """The user's membership used for dashboard and session API access (oldest first), its
    organization loaded with it."""
    with connection.cursor() as cursor:
        cursor.execute(_MEMBERSHIP_SQL, [user_id])
        row = cursor.fetchone()
    if row is None:
        return None
    split = len(_MEMBERSHIP_ROWS.fields)
    membership: Membership = _MEMBERSHIP_ROWS.instance(row[:split])
    membership.organization = _ORGANIZATION_ROWS.instance(row[split:])
    return membership


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
    if not plausible_key_id(key_id):
        raise NotFound("Key not found.", code="key_not_found")
    key = keys_visible_to(principal).select_related("organization", "user").filter(public_id=key_id).first()
    if key is None:
        raise NotFound("Key not found.", code="key_not_found")
    return key


def ensure_may_change_key(principal: Principal, key: ApiKey) -> None:
    """Revoke/cycle a key the caller can see (key_for_principal): a key may always act on itself;
    otherwise read-only keys and (outside a personal account) stack-bound agent keys may not, and
    a teacher only when the school allows it and only keys issued to them."""
    if principal.api_key is not None and principal.api_key.pk == key.pk:
        return
    if principal.read_only:
        raise Forbidden("This key is read-only.", code="read_only_key")
    if principal.organization.kind == Organization.Kind.PERSONAL:
        return
    if principal.is_stack_bound:
        raise Forbidden("An agent key may only change itself.", code="admin_required")
    ensure_teacher_may_manage_keys(principal)
    if is_teacher_session(principal) and key.user_id != principal.user.pk:
        # Cycling hands out the new secret: a teacher never receives the secret of a key that
        # acts as someone else (and would outlive the teacher's assignment).
        raise Forbidden("A teacher may only revoke or cycle keys issued to them.", code="not_key_owner")


def is_teacher_session(principal: Principal) -> bool:
    return principal.api_key is None and principal.role == Membership.Role.TEACHER


def teacher_may_manage_keys(principal: Principal) -> bool:
    """Teachers issue, revoke and cycle keys (for their assigned stacks) only when their school
    allows it (`Organization.teachers_may_manage_keys`, off by default)."""
    return is_teacher_session(principal) and principal.organization.teachers_may_manage_keys


def ensure_teacher_may_manage_keys(principal: Principal) -> None:
    if is_teacher_session(principal) and not teacher_may_manage_keys(principal):
        raise Forbidden("This school does not let teachers issue or change keys; ask a school admin.",
                        code="teacher_keys_disabled")


def may_issue_stack_agent_key(principal: Principal) -> bool:
    """Who may issue (or be handed by a cycle) a stack's own agent key — one that reads every memory
    of the stack, also those its grants keep from every member of staff: a school manager (an
    admin's session, a writable school key; docs/privacy.md "Keys and the grants"). Never a
    teacher, whatever the school's key policy, and never another agent key."""
    return may_manage_organization(principal)


def ensure_may_issue_stack_agent_key(principal: Principal) -> None:
    if not may_issue_stack_agent_key(principal):
        raise Forbidden("Only a school admin (or a writable school key) may issue a student's own agent key.",
                        code="stack_agent_needs_admin")


def _reads_as_issuer_of(principal: Principal, key: ApiKey) -> bool:
    """Does the caller read exactly what `key` reads, being its issuer (the school key that issued
    it, or the same person signed in) or its stack's own agent key?"""
    if principal.is_stack_agent and principal.bound_stack_id == key.stack_id:
        return True
    if key.issued_by_key:
        return principal.api_key is not None and principal.api_key.public_id == key.issued_by_key
    return principal.api_key is None and principal.user.pk == key.user_id


def ensure_may_receive_secret_of(principal: Principal, key: ApiKey) -> None:
    """A cycle hands its caller the new secret of `key`, which reads what `key` reads: the key
    itself may always cycle; a stack's own agent key only someone who may issue one; another
    stack-bound key only its issuer (anyone else revokes it and issues their own, which then reads
    what they may read). School-wide keys read as themselves, as before."""
    if principal.api_key is not None and principal.api_key.pk == key.pk:
        return
    if key.stack_id is None:
        return
    if key.stack_agent:
        ensure_may_issue_stack_agent_key(principal)
    elif not _reads_as_issuer_of(principal, key):
        raise Forbidden("Cycling hands out a secret that reads what this key's issuer may read; revoke the key and "
                        "issue your own instead.", code="not_key_issuer")


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
    # A log a moment old is fine (docs/production.md §4); who may read it was decided just above.
    return (AuditEvent.objects.using(read_alias()).filter(organization_id=principal.organization.pk)
            .select_related("actor", "actor_key"))
