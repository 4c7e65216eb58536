"""Dashboard pages. Every stack shown comes from stacks_visible_to — the one access decision."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from accounts.models import User
from accounts.selectors import principal_for_session
from stacks.selectors import stacks_visible_to


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    user = request.user
    assert isinstance(user, User)  # login_required ran
    principal = principal_for_session(user)
    if principal is None:
        return render(request, "stacks/dashboard.html", {"organization": None, "stacks": [], "role": None})
    stacks = stacks_visible_to(principal).order_by("status", "slug")
    return render(request, "stacks/dashboard.html",
                  {"organization": principal.organization, "stacks": stacks, "role": principal.role})
