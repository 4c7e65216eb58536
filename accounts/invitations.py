"""Invitations to join a school: an admin invites a person by email with a role; the person opens
the emailed link, sets a password (or, with an account already, signs in) and becomes a member.

The link carries a random token (256 bits); MemoryHub stores only its SHA-256, so neither the
database nor a backup holds a usable link — the admin sees the link once and the email carries
it. An invitation is pending until it is accepted, revoked or a week has passed; one pending
invitation per email per school. Creating, revoking and accepting are audited.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import smtplib
from dataclasses import dataclass
from datetime import timedelta

from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.template.loader import render_to_string
from django.utils import timezone

from accounts.models import Invitation, Membership, Organization, User
from accounts.principal import Principal
from accounts.selectors import email_taken, ensure_may_manage_organization
from accounts.services import audit_record, membership_add, normalized_email, user_create
from accounts.signals import invitation_accepted
from memoryhub.errors import Conflict, Forbidden, InvalidInput, NotFound

logger = logging.getLogger(__name__)

INVITATION_LIFETIME = timedelta(days=7)
MAX_TOKEN_LENGTH = 100  # a token is 43 characters; anything much longer is not one of ours


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def invitation_state(invitation: Invitation) -> str:
    """pending, accepted, revoked or expired."""
    if invitation.accepted_at is not None:
        return "accepted"
    if invitation.revoked_at is not None:
        return "revoked"
    if invitation.expires_at <= timezone.now():
        return "expired"
    return "pending"


# --- reads ------------------------------------------------------------------------------------


def invitations_open_for(principal: Principal) -> QuerySet[Invitation]:
    """The school's invitations not accepted or revoked (expired ones included, to be cleared)."""
    ensure_may_manage_organization(principal)
    return Invitation.objects.filter(organization_id=principal.organization.pk, accepted_at__isnull=True,
                                     revoked_at__isnull=True).select_related("invited_by")


def invitation_for_principal(principal: Principal, invitation_id: str) -> Invitation:
    """An invitation of the caller's school (404 for anything else) that the caller may manage."""
    ensure_may_manage_organization(principal)
    invitation = None
    if "\x00" not in invitation_id and len(invitation_id) <= 40:
        invitation = Invitation.objects.filter(organization_id=principal.organization.pk,
                                               public_id=invitation_id).first()
    if invitation is None:
        raise NotFound("Invitation not found.", code="invitation_not_found")
    return invitation


def invitation_for_token(token: str) -> Invitation | None:
    """The invitation a link's token names (in any state), or None."""
    if not token or len(token) > MAX_TOKEN_LENGTH or not token.isascii() or not token.isprintable():
        return None
    return Invitation.objects.select_related("organization").filter(token_hash=token_hash(token)).first()


# --- writes -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class NewInvitation:
    invitation: Invitation
    token: str  # shown once to the admin and emailed; never stored


@transaction.atomic
def invitation_create(*, organization: Organization, email: str, role: str, principal: Principal,
                      ip: str | None = None, name: str = "") -> NewInvitation:
    """Invite `email` to the school as `role` (`name`: optional, a new account starts with it). 409
    when the person is already a member or already has a pending invitation (revoke it to send a
    new one)."""
    ensure_may_manage_organization(principal)
    clean_email = normalized_email(email)
    if not clean_email:
        raise InvalidInput("Email is required.", fields={"email": ["Required."]})
    if role not in Membership.Role.values:
        raise InvalidInput("Unknown role.", fields={"role": [f"One of {', '.join(Membership.Role.values)}."]})
    if Membership.objects.filter(organization=organization, user__email__iexact=clean_email).exists():
        raise Conflict("This person is already a member of the school.", code="already_member",
                       fields={"email": ["Already a member of the school."]})
    pending = Invitation.objects.filter(organization=organization, email__iexact=clean_email,
                                        accepted_at__isnull=True, revoked_at__isnull=True)
    # An expired invitation is dead already; it only holds the one-pending-per-email slot.
    pending.filter(expires_at__lte=timezone.now()).delete()
    if pending.exists():
        raise Conflict("This email already has a pending invitation; revoke it to send a new one.",
                       code="invitation_pending", fields={"email": ["Already invited (pending)."]})
    token = secrets.token_urlsafe(32)
    try:
        with transaction.atomic():
            invitation = Invitation.objects.create(
                organization=organization, email=clean_email, role=role, token_hash=token_hash(token),
                invited_by=principal.user, expires_at=timezone.now() + INVITATION_LIFETIME,
                name=name.strip()[:150])
    except IntegrityError:  # lost a race with another invitation of the same email
        raise Conflict("This email already has a pending invitation; revoke it to send a new one.",
                       code="invitation_pending", fields={"email": ["Already invited (pending)."]}) from None
    audit_record(organization=organization, action="invitation.created", principal=principal,
                 target_type="invitation", target_id=invitation.public_id, ip=ip,
                 metadata={"email": clean_email, "role": role,
                           "expires_at": invitation.expires_at.isoformat()})
    return NewInvitation(invitation=invitation, token=token)


def invitation_children(invitation: Invitation) -> list[str]:
    """The students a guardian invitation is for, by name: what the invited parent is shown before
    joining (an invitation for staff names none)."""
    if invitation.role != Membership.Role.GUARDIAN:
        return []
    return [stack.display_name or stack.slug for stack in invitation.guardian_of.order_by("display_name", "slug")]


def invitation_email_send(*, invitation: Invitation, link: str) -> bool:
    """Email the invitation link (settings.EMAIL_BACKEND: the console by default, SMTP when
    configured). False when the mail could not be handed over: the admin still has the link."""
    body = render_to_string("dashboard/people/invitation_email.txt",
                            {"invitation": invitation, "link": link,
                             "organization": invitation.organization})
    try:
        send_mail(f"You are invited to {invitation.organization.name} on MemoryHub", body, None,
                  [invitation.email], fail_silently=False)
    except (OSError, smtplib.SMTPException) as error:
        # Never log the link: it is the invitation itself.
        logger.warning("invitation email for %s not sent: %s", invitation.public_id, type(error).__name__)
        return False
    return True


@transaction.atomic
def invitation_revoke(*, invitation: Invitation, principal: Principal, ip: str | None = None) -> Invitation:
    """Withdraw a pending (or expired) invitation; its link stops working. Idempotent; an
    accepted invitation cannot be revoked (remove the member instead)."""
    ensure_may_manage_organization(principal)
    locked = Invitation.objects.select_for_update().get(pk=invitation.pk)
    if locked.accepted_at is not None:
        raise Conflict("This invitation was accepted; remove the member instead.", code="invitation_accepted")
    if locked.revoked_at is None:
        locked.revoked_at = timezone.now()
        locked.save(update_fields=["revoked_at"])
        audit_record(organization=locked.organization, action="invitation.revoked", principal=principal,
                     target_type="invitation", target_id=locked.public_id, ip=ip,
                     metadata={"email": locked.email, "role": locked.role})
    return locked


@transaction.atomic
def invitation_accept(*, token: str, password: str | None = None, user: User | None = None,
                      ip: str | None = None) -> User:
    """Accept an invitation: with `user` (the signed-in account whose email it was sent to) add
    the membership; otherwise create the account with `password` (already checked against the
    password validators by the form) and add it. Returns the member. 409 when the link is no
    longer usable — expired, revoked, already used — even if two tabs race."""
    invitation = None
    found = invitation_for_token(token)
    if found is not None:
        invitation = (Invitation.objects.select_for_update(of=("self",)).select_related("organization")
                      .get(pk=found.pk))
    if invitation is None:
        raise NotFound("This invitation link is not valid.", code="invitation_not_found")
    if invitation_state(invitation) != "pending":
        raise Conflict("This invitation can no longer be used.", code="invitation_unusable")
    organization = invitation.organization
    if user is not None:
        if user.email.lower() != invitation.email.lower():
            raise Forbidden("This invitation was sent to another email address.", code="invitation_other_email")
        if Membership.objects.filter(organization=organization, user=user).exists():
            raise Conflict("You are already a member of this school.", code="already_member")
        member = user
    else:
        if email_taken(invitation.email):
            raise Conflict("An account with this email exists: sign in first, then open the link again.",
                           code="email_taken")
        if not password:
            raise InvalidInput("A password is required.", fields={"password1": ["Required."]})
        first, _, last = invitation.name.partition(" ")
        member = user_create(email=invitation.email, password=password, first_name=first, last_name=last)
    membership_add(organization=organization, user=member, role=invitation.role, ip=ip)
    invitation.accepted_at = timezone.now()
    invitation.accepted_by = member
    invitation.save(update_fields=["accepted_at", "accepted_by"])
    audit_record(organization=organization, action="invitation.accepted", actor=member,
                 target_type="invitation", target_id=invitation.public_id, ip=ip,
                 metadata={"role": invitation.role, "user_id": member.public_id})
    # What other apps attach to an invitation (a guardian's students) follows it in this transaction.
    invitation_accepted.send(sender=Invitation, invitation=invitation, member=member)
    return member
