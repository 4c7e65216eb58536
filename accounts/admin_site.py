"""The Django admin's site: Django's own, with the dashboard's sign-in lockout on /admin/login/.

WHY: staff reach every school, so the admin's sign-in must cost what the dashboard's does and share
its state (accounts/signin.py; docs/operations.md §5): failures on either page count together, and
an account or address locked on one is locked on the other — a locked sign-in is answered 429 with
Retry-After, even with the right password. Installed as the default site by
accounts.apps.AdminConfig (Django's `default_site`), so `admin.site` and every registration use it.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.http import HttpRequest, HttpResponse

from accounts.signin import LockoutFormMixin, locked_response


class LockoutAdminAuthenticationForm(LockoutFormMixin, AdminAuthenticationForm):
    """The admin's sign-in form (staff only) with the lockout; audited with `via: "admin"`."""

    via = "admin"


class AdminSite(admin.AdminSite):
    login_form = LockoutAdminAuthenticationForm

    def login(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        response = super().login(request, extra_context)
        context = getattr(response, "context_data", None) or {}
        return locked_response(response, context.get("form"))
