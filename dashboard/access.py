"""Who is asking for a dashboard page, and what a refusal looks like.

Every dashboard view is wrapped in `dashboard_page(roles=...)`. It requires a signed-in session,
resolves the session's Principal with accounts.selectors.principal_for_session — the same object
the API makes every decision from — and hands it to the view. Which stacks that principal reaches
is then decided only by stacks/selectors.py (stacks_visible_to, stack_for_principal), exactly as
for an API key: nothing here re-states a rule about stacks.

A page not meant for the caller's role answers 404 (a billing user learns nothing about student
pages; a teacher nothing about key pages), as does a stack the caller cannot see. The typed errors
that selectors and services raise (memoryhub.errors.DomainError: NotFound, Forbidden, Conflict,
InvalidInput, QuotaExceeded …) become an HTML page with their status and message, so no
dashboard request ends in a stack trace (docs/architecture.md §10).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import render

from accounts.models import Membership, User
from accounts.network import client_ip
from accounts.principal import Principal
from accounts.selectors import principal_for_session
from memoryhub.errors import DomainError

ADMIN = Membership.Role.ADMIN.value
TEACHER = Membership.Role.TEACHER.value
BILLING = Membership.Role.BILLING.value
GUARDIAN = Membership.Role.GUARDIAN.value

# Which roles a page is for. Stack pages are for staff (what each sees is the selectors' business).
STAFF = frozenset({ADMIN, TEACHER})
ADMINS = frozenset({ADMIN})
BILLING_PAGES = frozenset({ADMIN, BILLING})
# A guardian's pages: their children only (dashboard/views/families.py, docs/guardians.md); every
# other page is a 404 for them.
GUARDIANS = frozenset({GUARDIAN})

DashboardView = Callable[..., HttpResponseBase]


def dashboard_page(*, roles: frozenset[str] = STAFF) -> Callable[[DashboardView], Callable[..., HttpResponseBase]]:
    """Wrap a view `view(request, principal, **kwargs)` as a dashboard page for `roles`."""

    def decorate(view: DashboardView) -> Callable[..., HttpResponseBase]:
        @login_required
        @wraps(view)
        def page(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            user = request.user
            assert isinstance(user, User)  # login_required ran
            principal = principal_for_session(user)
            if principal is None:
                return refusal(request, status=403, code="no_school",
                               message="Your account does not belong to a school yet. Ask a school admin "
                                       "for an invitation.")
            request.principal = principal  # type: ignore[attr-defined]  # read by dashboard.context
            if principal.role not in roles:
                return refusal(request, status=404, code="not_found", message="There is no such page.")
            try:
                return view(request, principal, *args, **kwargs)
            except DomainError as error:
                response = refusal(request, status=error.status, code=error.code, message=error.message,
                                   fields=error.fields)
                if error.retry_after is not None:  # a busy lane says when to come back, as the API does
                    response["Retry-After"] = str(error.retry_after)
                return response

        return page

    return decorate


def refusal(request: HttpRequest, *, status: int, code: str, message: str,
            fields: dict[str, Any] | None = None) -> HttpResponse:
    """An error page (or, for an htmx request, just the message) with the error's status."""
    template = "dashboard/_error.html" if getattr(request, "htmx", False) else "dashboard/error.html"
    return render(request, template, {"status": status, "code": code, "message": message,
                                      "fields": fields or {}}, status=status)


def request_ip(request: HttpRequest) -> str | None:
    """The client address audited with a dashboard action (proxies per settings.TRUSTED_PROXIES)."""
    return client_ip(request)


def principal_of_page(request: HttpRequest) -> Principal | None:
    """The principal dashboard_page resolved for this request (None outside a dashboard page)."""
    principal = getattr(request, "principal", None)
    return principal if isinstance(principal, Principal) else None
