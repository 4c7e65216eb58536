"""Dashboard: a school admin's consent and pause buttons on a student's page (docs/consent.md).

The panel is `templates/dashboard/student/_consent.html`, included by the student's page; these
are its POST views. School admins only; the stack is resolved by the one access decision, and each
step is memories.governance.consent's (paper consent, its withdrawal, pause, resume), audited.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from accounts.principal import Principal
from dashboard.access import ADMINS, dashboard_page, request_ip
from memories.governance.consent import consent_give, consent_withdraw, memory_pause, memory_resume
from memoryhub.errors import InvalidInput
from stacks.models import StackConsent
from stacks.selectors import stack_for_principal


@dashboard_page(roles=ADMINS)
@require_POST
def student_consent(request: HttpRequest, principal: Principal, slug: str) -> HttpResponse:
    """Record paper consent (`action=given`) or its withdrawal (`action=withdrawn`), with a note."""
    stack = stack_for_principal(principal, slug)
    action = request.POST.get("action")
    note = request.POST.get("note", "")
    if action == StackConsent.Action.GIVEN:
        consent_give(stack, by=principal, method=StackConsent.Method.PAPER, ip=request_ip(request), note=note)
        messages.success(request, f"Paper consent recorded: agents may write to {stack.slug}'s memory.")
    elif action == StackConsent.Action.WITHDRAWN:
        _, certificate = consent_withdraw(stack, by=principal, method=StackConsent.Method.PAPER,
                                          ip=request_ip(request), note=note)
        if certificate is not None:
            messages.success(request, f"Consent withdrawn and {stack.slug}'s memory erased, as the school's "
                                      "policy says.")
            return redirect("dashboard:erasure", certificate_id=str(certificate.id))
        messages.success(request, f"Consent withdrawn: agents can no longer write to {stack.slug}'s memory.")
    else:
        raise InvalidInput("Choose to record or withdraw consent.", fields={"action": ["given or withdrawn"]})
    return redirect("dashboard:student", slug=stack.slug)


@dashboard_page(roles=ADMINS)
@require_POST
def student_pause(request: HttpRequest, principal: Principal, slug: str) -> HttpResponse:
    """Pause (`action=pause`) or resume (`action=resume`) the student's memory."""
    stack = stack_for_principal(principal, slug)
    action = request.POST.get("action")
    if action == "pause":
        memory_pause(stack, by=principal, ip=request_ip(request))
        messages.success(request, f"{stack.slug}'s memory is paused: agents' writes are refused, reads go on.")
    elif action == "resume":
        memory_resume(stack, by=principal, ip=request_ip(request))
        messages.success(request, f"{stack.slug}'s memory is resumed.")
    else:
        raise InvalidInput("Choose to pause or resume.", fields={"action": ["pause or resume"]})
    return redirect("dashboard:student", slug=stack.slug)
