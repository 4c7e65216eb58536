"""Template context for every page: the navigation the signed-in person's role may use."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from accounts.selectors import teacher_may_manage_keys
from dashboard.access import ADMIN, BILLING, GUARDIAN, TEACHER, principal_of_page

# (label, URL name, roles) in the order the navigation shows them.
NAVIGATION = (
    ("Overview", "dashboard:overview", {ADMIN, TEACHER}),
    ("Roster", "dashboard:roster", {ADMIN}),
    ("People", "dashboard:people", {ADMIN}),
    ("Keys", "dashboard:keys", {ADMIN}),
    ("Audit", "dashboard:audit", {ADMIN}),
    ("Webhooks", "dashboard:webhooks", {ADMIN}),
    ("Privacy", "dashboard:privacy", {ADMIN}),
    ("Requests", "dashboard:requests", {ADMIN}),
    ("Billing", "dashboard:billing", {ADMIN, BILLING}),
    ("Your children", "dashboard:families", {GUARDIAN}),
)


def navigation(request: HttpRequest) -> dict[str, Any]:
    principal = principal_of_page(request)
    if principal is None:
        return {"nav_items": [], "nav_principal": None}
    items = [(label, name) for label, name, roles in NAVIGATION
             if principal.role in roles or (name == "dashboard:keys" and teacher_may_manage_keys(principal))]
    return {"nav_items": items, "nav_principal": principal}
