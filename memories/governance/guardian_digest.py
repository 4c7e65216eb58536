"""The guardians' weekly digest: per child, how many memories of each kind the tutor added and
forgot in the past week — counts only, never a memory's text (docs/guardians.md "Weekly digest").

A guardian opts in on "Your children" (`digest_subscribe`; `accounts.Membership.weekly_digest`,
audited as `guardian.digest_changed`). `digests_send` is the weekly job (the Celery beat task
`memories.guardian_digest`, memoryhub/schedule.py): one e-mail per opted-in guardian, counting what
the guardian may read (their school's `guardian_view`, the privacy grants' audience) of each linked
child. A guardian who did not opt in gets nothing; a week with nothing added or forgotten says so.
"""

from __future__ import annotations

import logging
import smtplib
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.core.mail import send_mail
from django.db.models import Count
from django.utils import timezone

from accounts.models import Membership
from accounts.principal import Principal
from accounts.services import audit_record
from memories.models import Memory
from memories.privacy.grants import audience_for, grants_filter
from memoryhub.errors import Forbidden
from stacks.models import Stack

logger = logging.getLogger(__name__)
WEEK = timedelta(days=7)


@dataclass(frozen=True)
class ChildDigest:
    name: str
    added: dict[str, int]  # kind -> memories added in the week
    forgotten: dict[str, int]  # kind -> memories forgotten in the week


def digest_subscribe(principal: Principal, *, on: bool, ip: str | None = None) -> bool:
    """Opt the signed-in guardian in (or out) of the weekly digest; audited when it changes."""
    if principal.api_key is not None or principal.role != Membership.Role.GUARDIAN:
        raise Forbidden("The weekly digest is for guardians.", code="guardian_required")
    changed = Membership.objects.filter(user_id=principal.user.pk, organization_id=principal.organization.pk,
                                        role=Membership.Role.GUARDIAN).exclude(weekly_digest=on) \
        .update(weekly_digest=on)
    if changed:
        audit_record(organization=principal.organization, action="guardian.digest_changed", principal=principal,
                     target_type="user", target_id=str(principal.user.pk), ip=ip, metadata={"weekly_digest": on})
    return on


def digest_subscribed(principal: Principal) -> bool:
    """Has the signed-in guardian opted in?"""
    membership = Membership.objects.filter(user_id=principal.user.pk, organization_id=principal.organization.pk).first()
    return membership is not None and membership.weekly_digest


def _by_kind(queryset: object) -> dict[str, int]:
    return {row["kind"]: row["n"] for row in queryset.values("kind").annotate(n=Count("id")).order_by("kind")}  # type: ignore[attr-defined]


def digest_for(membership: Membership, *, end: datetime) -> list[ChildDigest]:
    """The week before `end`, per child linked to the guardian (by name), as the guardian may read it."""
    principal = Principal(user=membership.user, organization=membership.organization, role=membership.role)
    start = end - WEEK
    children = []
    for stack in Stack.objects.filter(organization_id=membership.organization_id,
                                      guardian_links__user_id=membership.user_id).order_by("display_name", "slug"):
        memories = grants_filter(Memory.objects.filter(stack_id=stack.pk),
                                 audience_for(principal, stack_id=stack.pk))
        children.append(ChildDigest(
            name=stack.display_name or stack.slug,
            added=_by_kind(memories.filter(created_at__gte=start, created_at__lt=end)),
            forgotten=_by_kind(memories.filter(forgotten_at__gte=start, forgotten_at__lt=end))))
    return children


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {kind}{'s' if n != 1 else ''}" for kind, n in counts.items()) or "none"


def digest_body(school: str, children: list[ChildDigest], *, end: datetime) -> str:
    """The e-mail's text: counts and kinds per child, nothing a memory says."""
    lines = [f"Hello,\n\nWhat your children's tutors at {school} remembered in the week to {end:%-d %B %Y}:\n"]
    for child in children:
        lines.append(f"{child.name}\n  added: {_counts(child.added)}\n  forgotten: {_counts(child.forgotten)}\n")
    lines.append("Sign in to MemoryHub to read the memories on your child's page. To stop these e-mails, "
                 "untick \"Send me a weekly e-mail\" on \"Your children\".\n")
    return "\n".join(lines)


def digests_send(*, now: datetime | None = None) -> int:
    """E-mail every opted-in guardian their digest of the week before `now`; the number sent."""
    end = now or timezone.now()
    sent = 0
    members = (Membership.objects.filter(role=Membership.Role.GUARDIAN, weekly_digest=True, user__is_active=True)
               .exclude(user__email="").select_related("user", "organization"))
    for membership in members:
        children = digest_for(membership, end=end)
        if not children:
            continue
        try:
            send_mail(f"This week at {membership.organization.name}: your children's tutors",
                      digest_body(membership.organization.name, children, end=end), None, [membership.user.email],
                      fail_silently=False)
        except (OSError, smtplib.SMTPException) as error:
            logger.warning("weekly digest for user %s not sent: %s", membership.user_id, type(error).__name__)
            continue
        sent += 1
    return sent
