"""A student's page: memories by kind, search, one memory's detail and history, forget/recover/protect,
the checkpoint and boot config, forgetting candidates, exports (docs/dashboard.md "Pages").

Thin views: the stack comes from `stacks.selectors.stack_for_principal` (write=True for changes, so
an archived stack answers 409), the reads and the audited writes from dashboard/student.py.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import messages
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from accounts.authors import Path
from accounts.principal import Principal
from dashboard import live
from dashboard import student as reads
from dashboard.access import ADMIN, STAFF, dashboard_page, request_ip
from memories.governance.archive import archive_chunks, archive_filename, archive_memory_ids
from memories.privacy.grants import audience_for
from memories.reads.access_history import may_read_access_log, memory_seen_by
from memories.reads.access_log import AccessPath, record_principal_access
from memories.reads.export import stack_memory_md
from memories.reads.usage import growth_chart, stack_usage
from memories.selectors import boot_config_entries, memories_list, memory_agents, memory_get
from memories.sessions.cards import session_cards
from memoryhub.errors import NotFound
from memoryhub.lanes import enter_bulk_lane, release_when_streamed
from memoryhub.streaming import streamed_content
from stacks.models import Stack
from stacks.selectors import stack_for_principal

_ACTION_DONE = {"forget": "Memory forgotten. It can be recovered from the “Only forgotten” list.",
                "recover": "Memory recovered.", "protect": "Memory protected: decay will not forget it.",
                "unprotect": "Memory unprotected."}


@require_GET
@dashboard_page(roles=STAFF)
def student_page(request: HttpRequest, principal: Principal, slug: str) -> HttpResponse:
    stack = stack_for_principal(principal, slug)
    # Before any read below: the page's live socket resumes from here, so nothing committed in
    # between is missed. Only a page served over ASGI can open its socket there.
    live_seq = live.stack_seq(stack) if isinstance(request, ASGIRequest) else None
    form = reads.MemoryFilterForm(request.GET)
    context: dict[str, Any] = {"stack": stack, "form": form, "is_admin": principal.role == ADMIN,
                               "manage_url": reverse("dashboard:student-manage", args=[stack.slug]), "page": None}
    if not form.is_valid():
        return render(request, "dashboard/student/page.html", context, status=400)
    filters = reads.MemoryFilters.of(form.cleaned_data)
    audience = audience_for(principal, stack_id=stack.pk)  # the privacy grants this viewer passes
    counts = reads.kind_counts(stack, filters, audience=audience)
    query = request.GET.copy()
    query.pop("page", None)
    tab_query = query.copy()
    tab_query.pop("kind", None)
    context.update(filters=filters, counts=counts, total=sum(counts.values()), query=query.urlencode(),
                   tab_query=tab_query.urlencode(), live_seq=live_seq)
    if filters.q:
        context["search"] = reads.memory_search(stack, filters, audience=audience)
        shown = [hit.memory.pk for hit in context["search"].hits]
    else:
        context["page"] = reads.memory_page(stack, filters, audience=audience)
        shown = [memory.pk for memory in context["page"]]
    context.update(
        **reads.checkpoint_panel(stack), agents=memory_agents(stack=stack, audience=audience),
        boot_config=list(boot_config_entries(stack=stack)), retention=reads.retention(stack, audience=audience),
        session_cards=session_cards(stack, audience=audience),
    )
    # Every memory whose text the page shows: the list or the hits, the forgetting candidates, the cards.
    shown += [memory.pk for memory in context["retention"].candidates]
    shown += [card["memory_id"] for card in context["session_cards"]]
    record_principal_access(principal, via=Path.DASHBOARD, stack_id=stack.pk, path=AccessPath.DASHBOARD,
                            memory_ids=shown)
    usage = stack_usage(stack=stack, principal=principal)
    context.update(usage=usage, usage_chart=growth_chart(usage))
    return render(request, "dashboard/student/page.html", context)


def _detail(request: HttpRequest, principal: Principal, slug: str, memory_id: str, *,
            forget_form: reads.ForgetForm | None = None, status: int = 200) -> HttpResponse:
    stack = stack_for_principal(principal, slug)
    memory = memory_get(stack=stack, memory_id=memory_id, audience=audience_for(principal, stack_id=stack.pk))
    record_principal_access(principal, via=Path.DASHBOARD, stack_id=stack.pk, path=AccessPath.DASHBOARD,
                            memory_ids=[memory.pk])
    # Who read it is for the school's admins (docs/privacy.md "Access log"), not every viewer.
    seen_by = memory_seen_by(stack=stack, memory_id=memory.pk) if may_read_access_log(principal, stack) else None
    return render(request, "dashboard/student/memory.html", {
        "stack": stack, "detail": reads.memory_detail(memory), "memory": memory,
        "forget_form": forget_form or reads.ForgetForm(), "is_admin": principal.role == ADMIN,
        "seen_by": seen_by,
    }, status=status)


@require_GET
@dashboard_page(roles=STAFF)
def memory_detail(request: HttpRequest, principal: Principal, slug: str, memory_id: str) -> HttpResponse:
    return _detail(request, principal, slug, memory_id)


@require_POST
@dashboard_page(roles=STAFF)
def memory_action(request: HttpRequest, principal: Principal, slug: str, memory_id: str,
                  action: str) -> HttpResponse:
    if action not in reads.MEMORY_ACTIONS:
        raise NotFound("There is no such action.", code="not_found")
    stack = stack_for_principal(principal, slug, write=True)
    memory = memory_get(stack=stack, memory_id=memory_id, audience=audience_for(principal, stack_id=stack.pk))
    reason = ""
    if action == "forget":
        form = reads.ForgetForm(request.POST)
        if not form.is_valid():
            return _detail(request, principal, slug, memory_id, forget_form=form, status=400)
        reason = form.cleaned_data["reason"]
    reads.memory_change(principal=principal, stack=stack, memory=memory, action=action, reason=reason,
                        ip=request_ip(request))
    messages.success(request, _ACTION_DONE[action])
    next_url = request.POST.get("next", "")
    if action == "protect" and next_url == "candidates":  # protected from the candidates list: back there
        return redirect(reverse("dashboard:student", args=[stack.slug]) + "#candidates")
    return redirect("dashboard:memory", stack.slug, memory.pk)



@require_GET
@dashboard_page(roles=STAFF)
def export_json(request: HttpRequest, principal: Principal, slug: str) -> HttpResponseBase:
    stack = stack_for_principal(principal, slug)
    enter_bulk_lane(request, stack.organization_id)
    now = timezone.now()
    reads.audit_export(principal=principal, stack=stack, ip=request_ip(request), export_format="json")
    audience = audience_for(principal, stack_id=stack.pk)
    chunks = reads.memories_json_chunks(stack=stack, now=now, audience=audience)
    record_principal_access(principal, via=Path.DASHBOARD, stack_id=stack.pk, path=AccessPath.EXPORT,
                            memory_ids=memories_list(stack=stack, audience=audience).values_list("id", flat=True))
    content = streamed_content(request, release_when_streamed(request, chunks))
    response = StreamingHttpResponse(content, content_type="application/json; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{reads.export_filename(stack, now, ".json")}"'
    response["Cache-Control"] = "private, no-store"
    return response


@require_GET
@dashboard_page(roles=STAFF)
def export_archive(request: HttpRequest, principal: Principal, slug: str) -> HttpResponseBase:
    """The same ZIP as `GET /api/v1/stacks/{stack}/export/archive` (memories.governance.archive), streamed, audited."""
    return archive_download(request, principal, stack_for_principal(principal, slug))


@require_GET
@dashboard_page(roles=STAFF)
def export_markdown(request: HttpRequest, principal: Principal, slug: str) -> HttpResponse:
    return memory_md_download(request, principal, stack_for_principal(principal, slug))


def archive_download(request: HttpRequest, principal: Principal, stack: Stack) -> HttpResponseBase:
    """`stack`'s portable archive for this viewer (a stack the access decision gave them): only what
    their privacy grants admit (memories.privacy.grants), the access log only for those who may
    read it; audited, and recorded in the access log, as theirs. Bulk work: it waits for, or is
    refused by, the bulk lane before anything is recorded (docs/architecture.md §5.7)."""
    enter_bulk_lane(request, stack.organization_id)
    now = timezone.now()
    reads.audit_export(principal=principal, stack=stack, ip=request_ip(request), export_format="zip")
    audience = audience_for(principal, stack_id=stack.pk)
    chunks = archive_chunks(stack=stack, now=now, audience=audience,
                            include_access_log=may_read_access_log(principal, stack))
    record_principal_access(principal, via=Path.DASHBOARD, stack_id=stack.pk, path=AccessPath.EXPORT,
                            memory_ids=archive_memory_ids(stack=stack, audience=audience))
    response = StreamingHttpResponse(streamed_content(request, release_when_streamed(request, chunks)),
                                     content_type="application/zip")
    response["Content-Disposition"] = f'attachment; filename="{archive_filename(stack, now)}"'
    response["Cache-Control"] = "private, no-store"
    return response


def memory_md_download(request: HttpRequest, principal: Principal, stack: Stack) -> HttpResponse:
    """`stack`'s MEMORY.md for this viewer, with what their grants admit; audited and recorded as theirs."""
    now = timezone.now()
    reads.audit_export(principal=principal, stack=stack, ip=request_ip(request), export_format="memory.md")
    served: list[uuid.UUID] = []
    body = stack_memory_md(stack=stack, now=now, audience=audience_for(principal, stack_id=stack.pk), served=served)
    record_principal_access(principal, via=Path.DASHBOARD, stack_id=stack.pk, path=AccessPath.MEMORY_MD,
                            memory_ids=served)
    response = HttpResponse(body, content_type="text/markdown; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{reads.export_filename(stack, now, "-MEMORY.md")}"'
    response["Cache-Control"] = "private, no-store"
    return response
