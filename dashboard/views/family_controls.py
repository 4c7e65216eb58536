"""Dashboard: a guardian's consent and pause controls on their child's page (docs/consent.md).

The controls are `templates/dashboard/families/_family_controls.html`, which the child's page
(dashboard/views/families.py) includes; these are their POST views. Guardians only
(`dashboard_page(roles=GUARDIANS)`); the child is resolved by the one access decision (a child not
linked to this guardian is a 404), and what a guardian may do is memories.governance.consent's
(online consent; pause and resume when the school allows it). The consent records the hash of the
sign-in session, never the session key.
"""

from __future__ import annotations

import hashlib

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from accounts.principal import Principal
from dashboard.access import GUARDIANS, dashboard_page, request_ip
from memories.governance.consent import consent_give, consent_withdraw, memory_pause, memory_resume
from memoryhub.errors import InvalidInput
from stacks.models import StackConsent
from stacks.selectors import stack_for_principal


def session_ref(request: HttpRequest) -> str:
    """Which sign-in gave the consent, as a hash (the session key itself is a credential)."""
    key = request.session.session_key or ""
    return hashlib.sha256(key.encode()).hexdigest() if key else ""


@dashboard_page(roles=GUARDIANS)
@require_POST
def family_consent(request: HttpRequest, principal: Principal, slug: str) -> HttpResponse:
    """Give (`action=given`) or withdraw (`action=withdrawn`) consent online."""
    stack = stack_for_principal(principal, slug)
    action = request.POST.get("action")
    name = stack.display_name or stack.slug
    if action == StackConsent.Action.GIVEN:
        consent_give(stack, by=principal, method=StackConsent.Method.ONLINE, ip=request_ip(request),
                     session_ref=session_ref(request))
        messages.success(request, f"Thank you: {name}'s tutor may now remember their learning.")
    elif action == StackConsent.Action.WITHDRAWN:
        _, certificate = consent_withdraw(stack, by=principal, method=StackConsent.Method.ONLINE,
                                          ip=request_ip(request), session_ref=session_ref(request))
        messages.success(request, f"Consent withdrawn: {name}'s tutor no longer adds to their memory"
                                  + (", and the school's policy erased what it held." if certificate else "."))
        if certificate is not None:
            return redirect("dashboard:families")
    else:
        raise InvalidInput("Choose to give or withdraw consent.", fields={"action": ["given or withdrawn"]})
    return redirect("dashboard:family-child", slug=stack.slug)


@dashboard_page(roles=GUARDIANS)
@require_POST
def family_pause(request: HttpRequest, principal: Principal, slug: str) -> HttpResponse:
    """Pause (`action=pause`) or resume (`action=resume`) the child's memory."""
    stack = stack_for_principal(principal, slug)
    action = request.POST.get("action")
    name = stack.display_name or stack.slug
    if action == "pause":
        memory_pause(stack, by=principal, ip=request_ip(request))
        messages.success(request, f"{name}'s memory is paused: the tutor adds nothing until you resume it.")
    elif action == "resume":
        memory_resume(stack, by=principal, ip=request_ip(request))
        messages.success(request, f"{name}'s memory is on again.")
    else:
        raise InvalidInput("Choose to pause or resume.", fields={"action": ["pause or resume"]})
    return redirect("dashboard:family-child", slug=stack.slug)
