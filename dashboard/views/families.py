"""Dashboard: a family's pages — a guardian's children and what their tutors remember
(docs/guardians.md, docs/dashboard.md "Pages").

Only guardians reach these pages (`dashboard_page(roles=GUARDIANS)`; every staff page is a 404 for a
guardian, and these are a 404 for staff). Which children a guardian sees is the one access decision,
`stacks.selectors.stacks_visible_to` / `stack_for_principal` (their linked stacks; another family's
child is a 404 like a stack that does not exist), and which memories of a child is the privacy
grants' (`memories.privacy.grants.audience_for`, following the school's `guardian_view`), applied in
SQL by the same reads the student page uses (dashboard/student.py). Reads are recorded in the
access log and exports in the audit log as the guardian.

The school's admins see and invite a student's guardians on the student page (`guardians_panel`).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import redirect, render
from django.template import TemplateDoesNotExist
from django.template.loader import select_template
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from accounts.authors import Path
from accounts.invitations import invitation_email_send
from accounts.principal import Principal
from dashboard import live
from dashboard import student as reads
from dashboard.access import ADMINS, GUARDIANS, dashboard_page, request_ip
from dashboard.views.student import archive_download, memory_md_download
from memories.governance.guardian_digest import digest_subscribe, digest_subscribed
from memories.governance.guardian_requests import requests_for_guardian
from memories.governance.privacy_settings import school_policy
from memories.lifecycle.decay_pass import forgetting_candidates
from memories.privacy.grants import audience_for
from memories.reads.access_log import AccessPath, record_principal_access
from memoryhub.errors import DomainError
from stacks.guardians import NAME_MAX, guardian_invite, guardians_of
from stacks.selectors import stack_for_principal, stacks_visible_to

# The consent and pause controls another part of the families feature adds to a child's page
# (docs/consent.md); the page includes them only when that template exists.
FAMILY_CONTROLS = "dashboard/families/_family_controls.html"
FADING_SHOWN = 5  # the memories the next decay pass will forget, shown on a child's page


def _family_controls_available() -> bool:
    try:
        select_template([FAMILY_CONTROLS])
    except TemplateDoesNotExist:
        return False
    return True


@require_GET
@dashboard_page(roles=GUARDIANS)
def children(request: HttpRequest, principal: Principal) -> HttpResponse:
    """"Your children": the students linked to this guardian, and nobody else."""
    linked = stacks_visible_to(principal).order_by("display_name", "slug")
    return render(request, "dashboard/families/children.html",
                  {"children": list(linked), "weekly_digest": digest_subscribed(principal)})


@dashboard_page(roles=GUARDIANS)
@require_POST
def family_digest(request: HttpRequest, principal: Principal) -> HttpResponse:
    """Opt in to (box ticked) or out of the weekly digest (memories.governance.guardian_digest)."""
    on = digest_subscribe(principal, on=request.POST.get("weekly_digest") == "on", ip=request_ip(request))
    messages.success(request, "You will get the weekly e-mail." if on else "You will not get the weekly e-mail.")
    return redirect("dashboard:families")


@require_GET
@dashboard_page(roles=GUARDIANS)
def child(request: HttpRequest, principal: Principal, slug: str) -> HttpResponse:
    """A child's page: the memories their agents hold (by kind, newest first, or searched), who
    wrote each, the checkpoint, and the downloads."""
    stack = stack_for_principal(principal, slug)
    # Before any read below: the page's live socket resumes from here (dashboard/live.py, as the student page).
    live_seq = live.stack_seq(stack) if isinstance(request, ASGIRequest) else None
    form = reads.MemoryFilterForm(request.GET)
    context: dict[str, Any] = {"stack": stack, "form": form, "page": None, "live_seq": live_seq,
                               "family_controls": _family_controls_available(),
                               "requests": requests_for_guardian(principal, stack),
                               "policy": school_policy(principal.organization),
                               "granted_only": principal.organization.guardian_view == "granted"}
    if not form.is_valid():
        return render(request, "dashboard/families/child.html", context, status=400)
    # A family sees what is remembered now: forgotten memories stay out, whatever the query says.
    filters = reads.MemoryFilters.of({**form.cleaned_data, "forgotten": "exclude"})
    audience = audience_for(principal, stack_id=stack.pk)
    counts = reads.kind_counts(stack, filters, audience=audience)
    query = request.GET.copy()
    query.pop("page", None)
    tab_query = query.copy()
    tab_query.pop("kind", None)
    context.update(filters=filters, counts={kind: n for kind, n in counts.items() if n},
                   total=sum(counts.values()), query=query.urlencode(), tab_query=tab_query.urlencode(),
                   **reads.checkpoint_panel(stack))
    if filters.q:
        context["search"] = reads.memory_search(stack, filters, audience=audience)
        shown = [hit.memory.pk for hit in context["search"].hits]
    else:
        context["page"] = reads.memory_page(stack, filters, audience=audience)
        shown = [memory.pk for memory in context["page"]]
    # What the next decay pass will forget (the pass's own rule), as this guardian may read it.
    next_pass = reads.next_decay_pass_at(timezone.now())
    fading = forgetting_candidates(stack=stack, now=next_pass, limit=FADING_SHOWN, audience=audience)
    context.update(next_pass_at=next_pass, fading=fading)
    shown += [memory.pk for memory in fading]
    record_principal_access(principal, via=Path.DASHBOARD, stack_id=stack.pk, path=AccessPath.DASHBOARD,
                            memory_ids=shown)
    return render(request, "dashboard/families/child.html", context)


@require_GET
@dashboard_page(roles=GUARDIANS)
def child_markdown(request: HttpRequest, principal: Principal, slug: str) -> HttpResponse:
    """The child's MEMORY.md, as the student page's export, with what this guardian may read."""
    return memory_md_download(request, principal, stack_for_principal(principal, slug))


@require_GET
@dashboard_page(roles=GUARDIANS)
def child_archive(request: HttpRequest, principal: Principal, slug: str) -> HttpResponseBase:
    """The child's portable archive (memories.governance.archive), streamed, with what this guardian
    may read and without the access log (that is the school's)."""
    return archive_download(request, principal, stack_for_principal(principal, slug))


# --- the admin's side: a student's guardians ------------------------------------------------------


class GuardianInviteForm(forms.Form):
    email = forms.EmailField(label="Guardian's email", max_length=254)
    name = forms.CharField(label="Name (optional)", max_length=NAME_MAX, required=False, strip=True)


@dashboard_page(roles=ADMINS)
@require_http_methods(["GET", "POST"])
def guardians_panel(request: HttpRequest, principal: Principal, slug: str) -> HttpResponse:
    """The student page's Guardians panel (loaded by htmx, and a page of its own without it): the
    student's guardians and pending invitations, and the invite form. A new invitation's link is
    shown once, in the answer to the POST that made it, and is not cacheable."""
    stack = stack_for_principal(principal, slug)
    form = GuardianInviteForm(request.POST if request.method == "POST" else None)
    context: dict[str, Any] = {"stack": stack, "form": form, "done": None, "link": "", "emailed": False}
    status = 200
    if request.method == "POST":
        if not form.is_valid():
            status = 400
        else:
            try:
                done = guardian_invite(principal=principal, stack=stack, email=form.cleaned_data["email"],
                                       name=form.cleaned_data["name"], ip=request_ip(request))
            except DomainError as error:
                form.add_error("email" if "email" in error.fields else None, error.message)
                status = error.status
            else:
                context["done"] = done
                form = GuardianInviteForm()
                context["form"] = form
                status = 201 if done.new is not None else 200
                if done.new is not None:
                    link = request.build_absolute_uri(reverse("dashboard:invitation-accept", args=[done.new.token]))
                    context.update(link=link, emailed=invitation_email_send(invitation=done.new.invitation,
                                                                            link=link))
    context["guardians"] = guardians_of(stack)
    template = "dashboard/families/_guardians.html" if getattr(request, "htmx", False) \
        else "dashboard/families/guardians.html"
    response = render(request, template, context, status=status)
    if context["link"]:
        add_never_cache_headers(response)
    return response
