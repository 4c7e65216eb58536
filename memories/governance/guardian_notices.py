"""The e-mails of guardians' requests (docs/guardians.md "Requests").

Sent with Django's mail API as the invitations are (accounts.invitations: settings.EMAIL_BACKEND,
the console by default, SMTP when configured). A body names the child, the kind of request, its
number, its due date and links to the pages — never a memory's text, the proposed correction or
anything else the memory holds. A mail that cannot be handed over is logged by the request's number
only and the step stands: the pages show the same.
"""

from __future__ import annotations

import logging
import smtplib

from django.core.mail import send_mail
from django.urls import reverse

from stacks.models import GuardianRequest

logger = logging.getLogger(__name__)


def _what(row: GuardianRequest) -> str:
    if row.kind == GuardianRequest.Kind.CORRECTION:
        return "a correction of one memory"
    if row.scope == GuardianRequest.Scope.MEMORY:
        return "the deletion of one memory"
    return "the deletion of all of the memory"


def _child(row: GuardianRequest) -> str:
    return row.stack.display_name or row.stack.slug


def _send(row: GuardianRequest, subject: str, body: str, recipients: list[str]) -> bool:
    if not recipients:
        return False
    try:
        send_mail(subject, body, None, recipients, fail_silently=False)
    except (OSError, smtplib.SMTPException) as error:
        logger.warning("guardian request %s: e-mail not sent: %s", row.pk, type(error).__name__)
        return False
    return True


def _guardian(row: GuardianRequest) -> list[str]:
    email = row.requested_by.email if row.requested_by is not None else ""
    return [email] if email else []


def _page(row: GuardianRequest, site: str) -> str:
    return site + reverse("dashboard:family-child", args=[row.stack.slug]) + "#requests"


def request_created(row: GuardianRequest, *, admins: list[str], site: str = "") -> None:
    """Tell the school's admins there is a request to decide, and the guardian it was received."""
    child, due = _child(row), f"{row.due_at:%-d %B %Y}"
    _send(row, f"Guardian request #{row.pk} for {child}: due {due}",
          f"A guardian of {child} asks for {_what(row)} (request #{row.pk}).\n\n"
          f"It is due by {due}. Read and decide it on the Requests page:\n\n"
          f"{site}{reverse('dashboard:request', args=[row.pk])}\n", admins)
    _send(row, f"Your request #{row.pk} for {child} was received",
          f"Hello,\n\n{row.organization.name} received your request for {_what(row)} of {child}'s "
          f"memory (request #{row.pk}). The school answers by {due}; you will get an e-mail when it does.\n\n"
          f"You can follow it on {child}'s page:\n\n{_page(row, site)}\n", _guardian(row))


def request_approved(row: GuardianRequest, *, site: str = "") -> None:
    """Tell the guardian the request was done; a deletion's e-mail carries the certificate's link."""
    child = _child(row)
    if row.kind == GuardianRequest.Kind.DELETION:
        link = site + reverse("dashboard:family-request-certificate", args=[row.stack.slug, row.pk])
        what = "the memory you named" if row.scope == GuardianRequest.Scope.MEMORY else "all of the memory"
        done = (f"{row.organization.name} erased {what} of {child}. The certificate of erasure says what "
                f"was erased, when and by whom:\n\n{link}\n")
    else:
        done = (f"{row.organization.name} corrected the memory you named in {child}'s memory; its history names "
                f"your request.\n\nSee it on {child}'s page:\n\n{_page(row, site)}\n")
    when = f" on {row.decided_at:%-d %B %Y}" if row.decided_at else ""
    _send(row, f"Your request #{row.pk} for {child} was approved", f"Hello,\n\nApproved{when}. {done}",
          _guardian(row))


def request_declined(row: GuardianRequest, *, site: str = "") -> None:
    """Tell the guardian the request was declined; the reason is on their page."""
    child = _child(row)
    _send(row, f"Your request #{row.pk} for {child} was declined",
          f"Hello,\n\n{row.organization.name} declined your request #{row.pk} for {_what(row)} of {child}'s "
          f"memory. Read the school's reason on {child}'s page:\n\n{_page(row, site)}\n", _guardian(row))
