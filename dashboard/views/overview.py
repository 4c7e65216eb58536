"""Dashboard: the school overview (being built)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from accounts.principal import Principal
from dashboard.access import dashboard_page
from stacks.selectors import stacks_visible_to


@dashboard_page()
def overview(request: HttpRequest, principal: Principal) -> HttpResponse:
    stacks = stacks_visible_to(principal).order_by("status", "slug")
    return render(request, "dashboard/overview.html",
                  {"organization": principal.organization, "stacks": stacks, "role": principal.role})
