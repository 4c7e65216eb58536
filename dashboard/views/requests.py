"""Dashboard: guardians' requests — a family asks for a correction or a deletion, the school's
admins decide it from the Requests queue (docs/guardians.md "Requests").

Thin: what a request is, who may do what, the e-mails and the audit are
memories.governance.guardian_requests'. A guardian's pages resolve the child through the one access
decision (`stack_for_principal`: another family's child is a 404) and the memory through the
guardian's grants (a memory they may not see is a 404); the queue is for school admins (a request of
another school is a 404). Bad input is a form error or the error page's 4xx, never a 500.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from accounts.principal import Principal
from dashboard.access import ADMINS, GUARDIANS, dashboard_page, request_ip
from memories.governance.erasure import certificate_document, certificate_verify
from memories.governance.guardian_requests import (
    CORRECTABLE,
    REASON_MAX,
    TEXT_MAX,
    request_approve,
    request_certificate,
    request_create,
    request_decline,
    request_for_school,
    request_memory,
    request_of_guardian,
    requests_for_school,
)
from memories.privacy.grants import audience_for
from memories.selectors import memory_get
from memoryhub.errors import DomainError, InvalidInput
from stacks.models import GuardianRequest
from stacks.selectors import stack_for_principal

NAV_SECTION = "dashboard:requests"


def _site(request: HttpRequest) -> str:
    """The address the e-mails' links start with (the page's own host, as invitations use)."""
    return request.build_absolute_uri("/").rstrip("/")


class CorrectionForm(forms.Form):
    text = forms.CharField(label="What it should say", max_length=TEXT_MAX, widget=forms.Textarea(attrs={"rows": 4}))


class DeclineForm(forms.Form):
    reason = forms.CharField(label="Why it is declined (the guardian reads this)", max_length=REASON_MAX,
                             widget=forms.Textarea(attrs={"rows": 3}))


# --- the guardian's side --------------------------------------------------------------------------

@dashboard_page(roles=GUARDIANS)
@require_http_methods(["GET", "POST"])
def family_memory_request(request: HttpRequest, principal: Principal, slug: str, memory_id: str) -> HttpResponse:
    """One memory of the child, with "ask for a correction" (the text they believe is right) and
    "ask for its deletion"."""
    stack = stack_for_principal(principal, slug)
    memory = memory_get(stack=stack, memory_id=memory_id, audience=audience_for(principal, stack_id=stack.pk))
    form = CorrectionForm(request.POST if request.POST.get("kind") == GuardianRequest.Kind.CORRECTION else None)
    status, problem = 200, ""
    if request.method == "POST":
        kind = request.POST.get("kind")
        if kind == GuardianRequest.Kind.CORRECTION and not form.is_valid():
            status = 400
        else:
            try:
                row = request_create(principal=principal, stack=stack, kind=kind, memory_id=str(memory.pk),
                                     text=form.cleaned_data["text"] if form.is_bound else "",
                                     ip=request_ip(request), site=_site(request))
            except InvalidInput as error:
                problem, status = error.message, error.status
            else:
                messages.success(request, f"Request #{row.pk} sent: the school answers by "
                                          f"{row.due_at:%-d %B %Y}. We e-mailed you a receipt.")
                return redirect(_child_requests(stack.slug))
    return render(request, "dashboard/families/memory_request.html",
                  {"stack": stack, "memory": memory, "form": form, "correctable": memory.kind in CORRECTABLE,
                   "problem": problem},
                  status=status)


def _child_requests(slug: str) -> str:
    return reverse("dashboard:family-child", args=[slug]) + "#requests"


@dashboard_page(roles=GUARDIANS)
@require_POST
def family_stack_request(request: HttpRequest, principal: Principal, slug: str) -> HttpResponse:
    """Ask for the deletion of all of the child's memory (the box confirming it must be ticked)."""
    stack = stack_for_principal(principal, slug)
    if request.POST.get("confirm") != "all":
        raise InvalidInput("Tick the box to confirm that you ask for all of the memory to be deleted.",
                           fields={"confirm": ["Required."]})
    row = request_create(principal=principal, stack=stack, kind=GuardianRequest.Kind.DELETION,
                         ip=request_ip(request), site=_site(request))
    messages.success(request, f"Request #{row.pk} sent: the school answers by {row.due_at:%-d %B %Y}. "
                              "We e-mailed you a receipt.")
    return redirect(_child_requests(stack.slug))


@require_GET
@dashboard_page(roles=GUARDIANS)
def family_request_certificate(request: HttpRequest, principal: Principal, slug: str, request_id: str) -> HttpResponse:
    """The certificate of erasure of the guardian's approved deletion request."""
    stack = stack_for_principal(principal, slug)
    cert = request_certificate(request_of_guardian(principal, stack, request_id))
    document = certificate_document(cert)
    return render(request, "dashboard/families/certificate.html", {
        "stack": stack, "cert": cert, "document": document, "valid": certificate_verify(document),
        "counts": sorted((key.replace("memory:", "").replace("_", " "), n) for key, n in document["counts"].items())})


# --- the school's side ----------------------------------------------------------------------------

@require_GET
@dashboard_page(roles=ADMINS)
def requests_queue(request: HttpRequest, principal: Principal) -> HttpResponse:
    """The Requests queue: open requests by due date (`?status=all`: every request, newest first)."""
    every = request.GET.get("status") == "all"
    rows = requests_for_school(principal, status=None if every else GuardianRequest.Status.OPEN)
    return render(request, "dashboard/requests/queue.html",
                  {"rows": rows, "every": every, "nav_section": NAV_SECTION,
                   "overdue": sum(1 for row in rows if row.overdue),
                   "due_soon": sum(1 for row in rows if row.due_soon and not row.overdue)})


@dashboard_page(roles=ADMINS)
@require_http_methods(["GET", "POST"])
def request_detail(request: HttpRequest, principal: Principal, request_id: str) -> HttpResponse:
    """One request: the memory as stored and the correction asked for; approve, or decline with a reason."""
    view = request_for_school(principal, request_id)
    row = view.request
    decline = DeclineForm(request.POST if request.POST.get("action") == "decline" else None)
    status, problem = 200, ""
    if request.method == "POST":
        action = request.POST.get("action")
        try:
            if action == "approve":
                request_approve(principal=principal, row=row, ip=request_ip(request), site=_site(request))
                messages.success(request, f"Request #{row.pk} approved; the guardian was e-mailed.")
                return redirect("dashboard:request", request_id=row.pk)
            if action == "decline":
                if not decline.is_valid():
                    status = 400
                else:
                    request_decline(principal=principal, row=row, reason=decline.cleaned_data["reason"],
                                    ip=request_ip(request), site=_site(request))
                    messages.success(request, f"Request #{row.pk} declined; the guardian was e-mailed.")
                    return redirect("dashboard:request", request_id=row.pk)
            else:
                raise InvalidInput("Choose to approve or decline.", fields={"action": ["approve or decline"]})
        except DomainError as error:
            if error.status >= 500:
                raise
            problem, status = error.message, error.status
        view = request_for_school(principal, request_id)
    context: dict[str, Any] = {"view": view, "row": view.request, "memory": request_memory(view.request),
                               "decline": decline, "problem": problem, "nav_section": NAV_SECTION}
    return render(request, "dashboard/requests/detail.html", context, status=status)

