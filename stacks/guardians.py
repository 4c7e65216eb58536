"""Guardians: parents and guardians who see what their child's tutor remembers (docs/guardians.md).

A guardian is a member of the school with the role "guardian" and one `GuardianLink` per child; the
one access decision (stacks.selectors.stacks_visible_to) gives them exactly their linked stacks, and
the privacy grants (memories.privacy.grants) decide which memories of those stacks they read.

* `guardian_invite`: a school manager (admin or writable school key) invites a guardian for one
  student. The existing invitation machinery (accounts.invitations: a one-time link, only its hash
  stored, a week's lifetime) carries it, with role "guardian" and the student in `guardian_of`. A
  person who is already a guardian in the school is linked at once; one with a pending guardian
  invitation gets the student added to it (their link then covers both children).
* Accepting the invitation (accounts.invitations.invitation_accept, with its password rules, the
  sign-in throttles and lockout) creates the membership; `links_for_accepted_invitation`, a receiver
  of `accounts.signals.invitation_accepted`, creates the links in the same transaction.
* `guardian_unlink` removes one link; `guardians_of` lists a student's guardians and the pending
  invitations that name the student.

Every change is audited (`guardian.invited`, `guardian.linked`, `guardian.unlinked`), never with
memory text.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from accounts.invitations import NewInvitation, invitation_create, invitation_state
from accounts.models import Invitation, Membership, User
from accounts.principal import Principal
from accounts.selectors import ensure_may_manage_organization
from accounts.services import audit_record, normalized_email
from accounts.signals import invitation_accepted
from memoryhub.errors import InvalidInput, NotFound
from stacks.models import GuardianLink, Stack

NAME_MAX = 150


@dataclass(frozen=True)
class GuardianInvite:
    """What `guardian_invite` did: `invited` (a new invitation; `new` carries its one-time token),
    `linked` (an existing guardian of the school, linked now) or `added_to_pending` (the student
    was added to the person's pending guardian invitation, whose link they already have)."""

    outcome: str
    email: str
    invitation: Invitation | None = None
    new: NewInvitation | None = None
    user: User | None = None


@dataclass(frozen=True)
class GuardianRow:
    """One line of a student's guardians: a linked guardian or a pending invitation naming them."""

    email: str
    name: str
    state: str  # "accepted" (linked), "pending" or "expired" (an invitation not used yet)
    linked_at: datetime | None
    user_id: str | None  # the guardian's public id, once linked
    invitation_id: str | None  # the pending invitation's public id


def _clean_name(name: Any) -> str:
    if name is None:
        return ""
    if not isinstance(name, str) or "\x00" in name or len(name.strip()) > NAME_MAX:
        raise InvalidInput(f"The name must be text of at most {NAME_MAX} characters.", code="invalid_name",
                           fields={"name": [f"At most {NAME_MAX} characters."]})
    return name.strip()


@transaction.atomic
def guardian_invite(*, principal: Principal, stack: Stack, email: Any, name: Any = "",
                    ip: str | None = None) -> GuardianInvite:
    """Invite `email` as a guardian of `stack` (a stack the caller reached through
    stacks.selectors.stack_for_principal). School managers only (403 `admin_required`). A member of
    the school with another role is a 409 `already_member`; a pending staff invitation of the same
    address a 409 `invitation_pending` (accounts.invitations)."""
    ensure_may_manage_organization(principal)
    clean_email = normalized_email(email)
    if not clean_email:
        raise InvalidInput("Email is required.", fields={"email": ["Required."]})
    clean_name = _clean_name(name)
    organization = stack.organization
    guardian = (Membership.objects.select_related("user")
                .filter(organization=organization, role=Membership.Role.GUARDIAN, user__email__iexact=clean_email)
                .first())
    if guardian is not None:
        _, created = GuardianLink.objects.get_or_create(user=guardian.user, stack=stack,
                                                        defaults={"created_by": principal.user})
        _audit(principal, stack, "guardian.invited", ip, email=clean_email, outcome="linked",
               user_id=guardian.user.public_id, created=created)
        return GuardianInvite(outcome="linked", email=clean_email, user=guardian.user)
    pending = (Invitation.objects.select_for_update()
               .filter(organization=organization, email__iexact=clean_email, role=Membership.Role.GUARDIAN,
                       accepted_at__isnull=True, revoked_at__isnull=True, expires_at__gt=timezone.now())
               .first())
    if pending is not None:
        pending.guardian_of.add(stack)
        _audit(principal, stack, "guardian.invited", ip, email=clean_email, outcome="added_to_pending",
               invitation_id=pending.public_id)
        return GuardianInvite(outcome="added_to_pending", email=clean_email, invitation=pending)
    new = invitation_create(organization=organization, email=clean_email, role=Membership.Role.GUARDIAN,
                            principal=principal, ip=ip, name=clean_name)
    new.invitation.guardian_of.add(stack)
    _audit(principal, stack, "guardian.invited", ip, email=clean_email, outcome="invited",
           invitation_id=new.invitation.public_id)
    return GuardianInvite(outcome="invited", email=clean_email, invitation=new.invitation, new=new)


@transaction.atomic
def guardian_unlink(*, principal: Principal, stack: Stack, user_public_id: str, ip: str | None = None) -> None:
    """Remove the guardian `user_public_id`'s link to `stack` (404 `guardian_not_found` when there is
    none). Their membership stays (they may be linked to other children); from now on the one
    access decision gives them nothing of this stack, and its live page closes within seconds."""
    ensure_may_manage_organization(principal)
    link = None
    if isinstance(user_public_id, str) and "\x00" not in user_public_id and len(user_public_id) <= 32:
        link = (GuardianLink.objects.select_related("user")
                .filter(stack=stack, user__public_id=user_public_id).first())
    if link is None:
        raise NotFound("Guardian not found.", code="guardian_not_found")
    link.delete()
    _audit(principal, stack, "guardian.unlinked", ip, user_id=link.user.public_id)


def links_for_accepted_invitation(sender: Any, invitation: Invitation, member: User, **kwargs: Any) -> None:
    """Receiver of accounts.signals.invitation_accepted: an accepted guardian invitation links its
    guardian to each student it names that is still in the school (in the accepting transaction)."""
    if invitation.role != Membership.Role.GUARDIAN:
        return
    for stack in Stack.objects.filter(organization_id=invitation.organization_id,
                                      pk__in=invitation.guardian_of.values("pk")):
        _, created = GuardianLink.objects.get_or_create(user=member, stack=stack,
                                                        defaults={"created_by": invitation.invited_by})
        if created:
            audit_record(organization=invitation.organization, action="guardian.linked", actor=member,
                         target_type="stack", target_id=stack.slug,
                         metadata={"user_id": member.public_id, "invitation_id": invitation.public_id})


def guardians_of(stack: Stack) -> list[GuardianRow]:
    """The student's linked guardians (oldest link first), then the pending or expired guardian
    invitations that name the student (newest first). The caller decided who may see them."""
    rows = [GuardianRow(email=link.user.email, name=link.user.get_full_name(), state="accepted",
                        linked_at=link.created_at, user_id=link.user.public_id, invitation_id=None)
            for link in GuardianLink.objects.filter(stack=stack).select_related("user").order_by("created_at", "pk")]
    invitations = (Invitation.objects.filter(organization_id=stack.organization_id, role=Membership.Role.GUARDIAN,
                                             guardian_of=stack, accepted_at__isnull=True, revoked_at__isnull=True)
                   .order_by("-created_at"))
    rows += [GuardianRow(email=invitation.email, name=invitation.name, state=invitation_state(invitation),
                         linked_at=None, user_id=None, invitation_id=invitation.public_id)
             for invitation in invitations]
    return rows


def _audit(principal: Principal, stack: Stack, action: str, ip: str | None, **metadata: Any) -> None:
    audit_record(organization=stack.organization, action=action, principal=principal, target_type="stack",
                 target_id=stack.slug, ip=ip, metadata=metadata)


def connect() -> None:
    """Called by StacksConfig.ready(): link guardians when their invitation is accepted."""
    invitation_accepted.connect(links_for_accepted_invitation, dispatch_uid="stacks.guardians.links")
