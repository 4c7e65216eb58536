"""Every write about stacks: create, update, archive, teacher assignments, self-registration, and
removing a person from a school (their stack assignments go with them, so it lives here, above
accounts).

Creating and unarchiving a stack enforce the tier's stack quota (`ensure_may_activate_stack`)
under the organization's row lock, so no path — API, dashboard, commands, kernle's first push —
gives a school more active stacks than its tier allows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.models import ApiKey, Membership, Organization, User
from accounts.principal import Principal
from accounts.services import (
    api_key_issue,
    api_keys_revoke_beyond_reach,
    audit_record,
    membership_add,
    normalized_email,
    organization_create,
    sessions_end,
    user_create,
)
from memoryhub.errors import Conflict, InvalidInput, NotFound
from stacks.models import GuardianLink, Stack, TeacherAssignment
from stacks.selectors import ensure_may_activate_stack

STACK_ID_MAX_LENGTH = 100
_STACK_ID_EXTRA = frozenset("-_.")


def stack_id_validated(raw: Any, *, field: str = "stack_id") -> str:
    """Kernle's stack-id alphabet (docs/kernle-protocol.md §1.3): 1-100 characters, letters and digits
    (Unicode `isalnum`), '-', '_' and '.'; no path separators; not '.' or '..'."""
    if not isinstance(raw, str):
        raise InvalidInput(f"{field} must be a string.", code="invalid_stack_id", fields={field: ["Must be a string."]})
    value = raw.strip()
    problem = None
    if not value:
        problem = "is required"
    elif len(value) > STACK_ID_MAX_LENGTH:
        problem = f"must be at most {STACK_ID_MAX_LENGTH} characters"
    elif value in {".", ".."} or not all(ch.isalnum() or ch in _STACK_ID_EXTRA for ch in value):
        problem = "may contain only letters, digits, '-', '_' and '.'"
    if problem:
        raise InvalidInput(f"Invalid {field}: {problem}.", code="invalid_stack_id", fields={field: [problem]})
    return value


def _lock_organization_for_stack_quota(organization: Organization) -> None:
    """Serialise creates and unarchives per organization, so two cannot both pass the stack quota.

    FOR NO KEY UPDATE, not FOR UPDATE: it still conflicts with every other quota lock (and with
    kernle provisioning's FOR UPDATE) but not with the key-share locks that inserting a row which
    references the organization takes — audit events, keys and memberships are not held up.
    """
    Organization.objects.select_for_update(no_key=True).filter(pk=organization.pk).values_list("pk", flat=True).first()


@transaction.atomic
def stack_create(*, organization: Organization, slug: Any, display_name: str = "", kind: str = Stack.Kind.STUDENT,
                 principal: Principal | None = None, created_by: User | None = None, ip: str | None = None,
                 grade: str = "") -> Stack:
    """A new active stack; QuotaExceeded (402) when the tier allows no more active stacks."""
    slug = stack_id_validated(slug)
    if kind not in Stack.Kind.values:
        raise InvalidInput("Unknown stack kind.", fields={"kind": [f"One of {', '.join(Stack.Kind.values)}."]})
    _lock_organization_for_stack_quota(organization)
    ensure_may_activate_stack(organization=organization)
    try:
        with transaction.atomic():
            stack = Stack.objects.create(organization=organization, slug=slug, display_name=display_name[:200],
                                         grade=grade[:32], kind=kind,
                                         created_by=created_by or (principal.user if principal else None))
    except IntegrityError:
        raise Conflict("A stack with this id already exists.", code="stack_exists",
                       fields={"stack_id": ["Already exists."]}) from None
    audit_record(organization=organization, action="stack.created", principal=principal, actor=created_by,
                 target_type="stack", target_id=slug, ip=ip, metadata={"kind": kind})
    return stack


@transaction.atomic
def stack_update(*, stack: Stack, display_name: str | None = None, kind: str | None = None,
                 principal: Principal | None = None, ip: str | None = None, grade: str | None = None) -> Stack:
    """Change descriptive fields. Caller has checked write access (stack_for_principal(write=True))."""
    changed: list[str] = []
    if display_name is not None:
        stack.display_name = display_name[:200]
        changed.append("display_name")
    if grade is not None:
        stack.grade = grade[:32]
        changed.append("grade")
    if kind is not None:
        if kind not in Stack.Kind.values:
            raise InvalidInput("Unknown stack kind.", fields={"kind": [f"One of {', '.join(Stack.Kind.values)}."]})
        stack.kind = kind
        changed.append("kind")
    if changed:
        stack.save(update_fields=[*changed, "updated_at"])
        audit_record(organization=stack.organization, action="stack.updated", principal=principal,
                     target_type="stack", target_id=stack.slug, ip=ip, metadata={"fields": changed})
    return stack


@transaction.atomic
def stack_archive(*, stack: Stack, principal: Principal | None = None, ip: str | None = None) -> Stack:
    """Archive (idempotent): the stack keeps every memory but refuses writes (ensure_writable)."""
    locked = Stack.objects.select_for_update().select_related("organization").get(pk=stack.pk)
    if locked.status != Stack.Status.ARCHIVED:
        locked.status = Stack.Status.ARCHIVED
        locked.archived_at = timezone.now()
        locked.save(update_fields=["status", "archived_at", "updated_at"])
        audit_record(organization=locked.organization, action="stack.archived", principal=principal,
                     target_type="stack", target_id=locked.slug, ip=ip)
    return locked


@transaction.atomic
def stack_unarchive(*, stack: Stack, principal: Principal | None = None, ip: str | None = None) -> Stack:
    """Make an archived stack writable again (idempotent); QuotaExceeded (402) when the tier allows
    no more active stacks. Takes the organization's quota lock before the stack's row lock, the
    order kernle provisioning (which holds both) keeps too."""
    _lock_organization_for_stack_quota(stack.organization)
    locked = Stack.objects.select_for_update().select_related("organization").get(pk=stack.pk)
    if locked.status != Stack.Status.ACTIVE:
        ensure_may_activate_stack(organization=locked.organization)
        locked.status = Stack.Status.ACTIVE
        locked.archived_at = None
        locked.save(update_fields=["status", "archived_at", "updated_at"])
        audit_record(organization=locked.organization, action="stack.unarchived", principal=principal,
                     target_type="stack", target_id=locked.slug, ip=ip)
    return locked


@transaction.atomic
def teacher_assign(*, stack: Stack, teacher: User, principal: Principal | None = None,
                   ip: str | None = None) -> TeacherAssignment:
    if not Membership.objects.filter(user=teacher, organization_id=stack.organization_id,
                                     role=Membership.Role.TEACHER).exists():
        raise InvalidInput("Only a teacher of this school can be assigned.", code="not_a_teacher",
                           fields={"user_id": ["Not a teacher of this school."]})
    assignment, created = TeacherAssignment.objects.get_or_create(user=teacher, stack=stack)
    if created:
        audit_record(organization=stack.organization, action="stack.teacher_assigned", principal=principal,
                     target_type="stack", target_id=stack.slug, ip=ip, metadata={"user_id": teacher.public_id})
    return assignment


@transaction.atomic
def teacher_unassign(*, stack: Stack, teacher: User, principal: Principal | None = None, ip: str | None = None) -> None:
    """End a teacher's assignment; the keys they hold for that stack end with it (access dies with
    its grant: authentication also refuses them, accounts.selectors.with_issuer_reach)."""
    deleted, _ = TeacherAssignment.objects.filter(user=teacher, stack=stack).delete()
    if deleted:
        audit_record(organization=stack.organization, action="stack.teacher_unassigned", principal=principal,
                     target_type="stack", target_id=stack.slug, ip=ip, metadata={"user_id": teacher.public_id})
        api_keys_revoke_beyond_reach(organization=stack.organization, user=teacher, reason="teacher_unassigned",
                                     principal=principal, ip=ip)


@transaction.atomic
def membership_remove(*, organization: Organization, user_public_id: str, principal: Principal | None = None,
                      ip: str | None = None) -> None:
    """Remove a person from a school: their keys there are revoked, their stack assignments
    dropped (a guardian's links to their children too) and their signed-in sessions ended, so
    nothing keeps acting as someone who left."""
    membership = None
    if "\x00" not in user_public_id and len(user_public_id) <= 32:
        membership = (Membership.objects.select_for_update().select_related("user")
                      .filter(organization=organization, user__public_id=user_public_id).first())
    if membership is None:
        raise NotFound("Member not found.", code="member_not_found")
    if membership.role == Membership.Role.ADMIN and not Membership.objects.filter(
            organization=organization, role=Membership.Role.ADMIN).exclude(pk=membership.pk).exists():
        raise Conflict("A school keeps at least one admin.", code="last_admin")
    user = membership.user
    membership.delete()
    TeacherAssignment.objects.filter(user=user, stack__organization=organization).delete()
    GuardianLink.objects.filter(user=user, stack__organization=organization).delete()  # a guardian's children
    audit_record(organization=organization, action="member.removed", principal=principal,
                 target_type="user", target_id=user.public_id, ip=ip)
    # Without a membership nothing is within their reach: every key they hold here is revoked.
    api_keys_revoke_beyond_reach(organization=organization, user=user, reason="member_removed",
                                 principal=principal, ip=ip)
    # Their dashboard sessions end too (on every device; they may sign in again for another school).
    sessions_end(user=user)


@dataclass(frozen=True)
class Registration:
    user: User
    organization: Organization
    stack: Stack
    key: ApiKey
    secret: str


@transaction.atomic
def personal_account_register(*, stack_id: Any, email: Any = None, display_name: Any = None,
                              ip: str | None = None) -> Registration:
    """Kernle self-registration (docs/kernle-protocol.md §2.2): a user, their personal organization,
    the stack and a key bound to it. All or nothing."""
    slug = stack_id_validated(stack_id)
    clean_email = normalized_email(email)
    if display_name is not None and (not isinstance(display_name, str) or "\x00" in display_name):
        raise InvalidInput("display_name must be text.", fields={"display_name": ["Must be text."]})
    name = display_name.strip() if display_name and display_name.strip() else (clean_email or slug)
    user = user_create(email=clean_email)  # 409 "Email already registered" on a duplicate
    organization = organization_create(name=name, kind=Organization.Kind.PERSONAL, slug=f"personal-{user.public_id}")
    membership_add(organization=organization, user=user, role=Membership.Role.ADMIN, ip=ip)
    stack = stack_create(organization=organization, slug=slug, display_name=name, kind=Stack.Kind.AGENT,
                         created_by=user, ip=ip)
    # The registering agent's own key: the stack's own credential (docs/privacy.md "Keys and the grants").
    key, secret = api_key_issue(organization=organization, user=user, stack_id=stack.pk, name="register",
                                stack_agent=True, ip=ip)
    return Registration(user=user, organization=organization, stack=stack, key=key, secret=secret)
