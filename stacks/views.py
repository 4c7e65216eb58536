"""Dashboard pages. Every stack shown comes from stacks_visible_to — the one access decision."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from accounts.models import User
from accounts.principal import Principal
from accounts.selectors import membership_for_user
from stacks.selectors import stacks_visible_to


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    user = request.user
    assert isinstance(user, User)  # login_required ran
    membership = membership_for_user(user.pk)
    if membership is None:
        return render(request, "stacks/dashboard.html", {"organization": None, "stacks": [], "role": None})
    principal = Principal(user=user, organization=membership.organization, role=membership.role,
                          credential_id=f"session:{user.public_id}")
    stacks = stacks_visible_to(principal).order_by("status", "slug")
    return render(request, "stacks/dashboard.html",
                  {"organization": membership.organization, "stacks": stacks, "role": membership.role})
