"""Dashboard: API keys — list, issue, revoke, cycle.

For school admins, and for teachers only when their school lets them manage keys (for their
assigned stacks); for anyone else every key page is a 404. The rules are the API's own:
accounts.selectors (keys_visible_to, key_to_change, ensure_teacher_may_manage_keys,
may_manage_organization) and stacks.selectors.stack_for_new_key; issuing, revoking and cycling
are accounts.services' audited calls, exactly as stacks.api.KeyListView and accounts.api use them.

A new secret is shown once, in the answer to the POST that made it — never through a redirect,
the session, the message framework or a log — on a page marked not cacheable (no-store).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, date, datetime, time
from typing import Any

from django import forms
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.cache import add_never_cache_headers
from django.views.decorators.http import require_http_methods, require_POST

from accounts.key_usage import key_usage_lines
from accounts.models import ApiKey
from accounts.principal import Principal
from accounts.selectors import (
    ensure_may_change_key,
    ensure_may_receive_secret_of,
    ensure_teacher_may_manage_keys,
    key_to_change,
    keys_visible_to,
    may_issue_stack_agent_key,
    may_manage_organization,
)
from accounts.services import api_key_cycle, api_key_issue, api_key_revoke
from dashboard.access import STAFF, dashboard_page, request_ip
from memoryhub.errors import Forbidden, NotFound
from stacks.models import Stack
from stacks.selectors import stack_for_new_key, stacks_visible_to

KEYS_PER_PAGE = 50
SCHOOL_WIDE = ("", "School-wide")  # the scope choice of a key bound to no stack


def _key_manager(principal: Principal) -> None:
    """Key pages exist only for those who may manage keys: a teacher whose school does not allow
    it gets a 404 (not a 403), as for any page not meant for them."""
    try:
        ensure_teacher_may_manage_keys(principal)
    except Forbidden:
        raise NotFound("There is no such page.") from None


class IssueKeyForm(forms.Form):
    name = forms.CharField(label="Key name", max_length=100,
                           help_text="What the key is for, e.g. the agent or laptop that holds it.")
    scope = forms.ChoiceField(label="Scope", required=False,
                              help_text="A student's stack (an agent's key), or the whole school (a service key).")
    read_only = forms.BooleanField(label="Read-only", required=False)
    # The one choice that makes a key read more than its issuer (docs/privacy.md "Keys and the
    # grants"): named for what it does, off by default, offered only to those who may make it.
    stack_agent = forms.BooleanField(
        label="This key is the student's own agent — it reads memories shared only with the student",
        required=False,
        help_text="Only for the student's tutor agent. Such a key reads every memory of the student's stack, also "
                  "those no member of staff may read, and the audit log records the choice. Leave it off and the "
                  "key reads what you may read.")
    expires_on = forms.DateField(label="Expires on", required=False, widget=forms.DateInput(attrs={"type": "date"}),
                                 help_text="Optional. The key stops working at 00:00 UTC on this day.")

    def __init__(self, *args: Any, scopes: list[tuple[str, str]], may_issue_stack_agent: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        scope = self.fields["scope"]
        assert isinstance(scope, forms.ChoiceField)
        scope.choices = scopes
        # "" is School-wide: only an offered choice may be left empty (else "" would skip validation).
        scope.required = SCHOOL_WIDE not in scopes
        if not may_issue_stack_agent:
            del self.fields["stack_agent"]  # a teacher: the service would refuse it anyway (403)

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if cleaned.get("stack_agent") and not cleaned.get("scope"):
            self.add_error("stack_agent", "Only a key bound to a student's stack can be that student's own agent.")
        return cleaned

    def clean_expires_on(self) -> date | None:
        day: date | None = self.cleaned_data.get("expires_on")
        if day is not None and day <= timezone.now().astimezone(UTC).date():
            raise forms.ValidationError("Choose a day after today.")
        return day

    def expires_at(self) -> datetime | None:
        day = self.cleaned_data.get("expires_on")
        return datetime.combine(day, time.min, tzinfo=UTC) if day else None


def _scopes(principal: Principal) -> list[tuple[str, str]]:
    """"School-wide" for those who may issue a school key, then each active stack the caller sees."""
    scopes = [SCHOOL_WIDE] if may_manage_organization(principal) else []
    slugs = (stacks_visible_to(principal).filter(status=Stack.Status.ACTIVE).order_by("slug")
             .values_list("slug", flat=True))
    return scopes + [(slug, slug) for slug in slugs]


def _status(key: ApiKey) -> str:
    if key.revoked_at is not None:
        return "revoked"
    if key.expires_at is not None and key.expires_at <= timezone.now():
        return "expired"
    return "active"


def _allowed(check: Callable[[Principal, ApiKey], None], principal: Principal, key: ApiKey) -> bool:
    try:
        check(principal, key)
    except Forbidden:
        return False
    return True


def _issue_form(principal: Principal, data: Any = None) -> IssueKeyForm:
    return IssueKeyForm(data, scopes=_scopes(principal), may_issue_stack_agent=may_issue_stack_agent_key(principal))


def _keys_page(request: HttpRequest, principal: Principal, *, form: IssueKeyForm | None = None,
               new_key: ApiKey | None = None, secret: str = "", replaced: ApiKey | None = None,
               status: int = 200) -> HttpResponse:
    keys = keys_visible_to(principal).select_related("stack", "user").order_by("-created_at", "-pk")
    page = Paginator(keys, KEYS_PER_PAGE).get_page(request.GET.get("page"))
    # (key, status, may revoke, may cycle): a cycle hands out the new secret, which reads what the key
    # reads, so it may be refused where a revoke is not (accounts.selectors.ensure_may_receive_secret_of).
    rows = [(key, _status(key), _allowed(ensure_may_change_key, principal, key),
             _allowed(ensure_may_change_key, principal, key)
             and _allowed(ensure_may_receive_secret_of, principal, key)) for key in page.object_list]
    usage: list[str] = []
    if new_key is not None:
        base_url = request.build_absolute_uri("/").rstrip("/")
        # The command lines `issue_key` prints, so the CLI and the dashboard teach the same usage.
        usage = [line.strip() for line in key_usage_lines(new_key, secret, url=base_url) if line.startswith("  ")]
    response = render(request, "dashboard/keys/index.html", {
        "form": form or _issue_form(principal), "page": page, "rows": rows,
        "new_key": new_key, "secret": secret, "usage": usage, "replaced": replaced,
    }, status=status)
    # Every keys page is no-store: the one that shows a secret must never be kept by a cache or
    # the browser's history, and the list should not be either.
    add_never_cache_headers(response)
    return response


@dashboard_page(roles=STAFF)
@require_http_methods(["GET", "POST"])
def keys(request: HttpRequest, principal: Principal) -> HttpResponse:
    _key_manager(principal)
    if request.method != "POST":
        return _keys_page(request, principal)
    form = _issue_form(principal, request.POST)
    if not form.is_valid():
        return _keys_page(request, principal, form=form, status=400)
    stack_agent = bool(form.cleaned_data.get("stack_agent"))
    stack = stack_for_new_key(principal, form.cleaned_data["scope"] or None, stack_agent=stack_agent)
    key, secret = api_key_issue(organization=principal.organization, user=principal.user,
                                stack_id=stack.pk if stack else None, name=form.cleaned_data["name"],
                                read_only=form.cleaned_data["read_only"], expires_at=form.expires_at(),
                                stack_agent=stack_agent, principal=principal, ip=request_ip(request))
    return _keys_page(request, principal, new_key=key, secret=secret, status=201)


@dashboard_page(roles=STAFF)
@require_POST
def key_revoke(request: HttpRequest, principal: Principal, key_id: str) -> HttpResponse:
    _key_manager(principal)
    key = api_key_revoke(key=key_to_change(principal, key_id), principal=principal, ip=request_ip(request))
    messages.success(request, f"Key {key.name or key.key_prefix} was revoked; it no longer works.")
    return redirect("dashboard:keys")


@dashboard_page(roles=STAFF)
@require_POST
def key_cycle(request: HttpRequest, principal: Principal, key_id: str) -> HttpResponse:
    _key_manager(principal)
    old_key = key_to_change(principal, key_id)
    new_key, secret = api_key_cycle(key=old_key, principal=principal, ip=request_ip(request))
    return _keys_page(request, principal, new_key=new_key, secret=secret, replaced=old_key, status=201)
