"""The billing page: a school's plan and what it uses now, for admins and billing users — and for
a billing user, nothing else of the dashboard."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, reverse

from accounts.models import Membership, Organization
from accounts.tiers import MB
from memories.services import memory_create
from stacks.models import Stack
from tests.actors import School
from tests.dashboard.pages import client_for
from tests.factories import make_org, make_stack, make_user

pytestmark = pytest.mark.django_db

URL = "/dashboard/billing/"


def chart(page: str) -> dict[str, Any]:
    spec = re.search(r'<script id="chart-usage" type="application/json">(.*?)</script>', page, re.S)
    assert spec is not None
    return json.loads(spec.group(1))


def test_an_admin_sees_the_plan_and_usage_measured_as_billing_enforces_it(school: School) -> None:
    # The cast's school is on "pro": 10 active stacks, 1 GB. Two active stacks, one archived.
    make_stack(school.org, "gone", status=Stack.Status.ARCHIVED)
    memory_create(stack=school.stack, kind="note", payload={"content": "Fractions click with pizza"}, source="api")
    memory_create(stack=school.other_stack, kind="note", payload={"content": "Likes maps"}, source="api")
    Stack.objects.filter(pk=school.stack.pk).update(bytes_used=300 * MB)

    response = client_for(school.admin).get(URL)

    assert response.status_code == 200
    page = response.content.decode()
    assert re.search(r'id="plan-name">Pro<', page)
    assert re.search(r'id="usage-stacks">2 <span class="stat-label">of 10</span>', page)
    assert "1 archived stack (not counted)" in page
    assert re.search(r'id="usage-storage">300\.0\s*MB <span class="stat-label">of 1 GB</span>', page)
    assert re.search(r'id="usage-memories">2<', page)
    spec = chart(page)
    assert spec["type"] == "bar" and spec["labels"] == ["Active stacks", "Storage"]
    assert spec["datasets"][0]["data"][0] == 20.0 and 29 < spec["datasets"][0]["data"][1] < 30
    # Every plan a school can be on, to compare; the school's own marked. No way to pay yet.
    for name in ("free", "core", "pro", "enterprise"):
        assert f'data-tier="{name}"' in page
    assert 'data-tier="unlimited"' not in page
    assert re.search(r'data-tier="pro">.*?your plan', page, re.S)
    assert "USDC" in page and "<form" not in page.split('id="content"')[1]
    # A school's usage, never a student's name.
    assert school.stack.slug not in page and "Fractions" not in page


def test_a_school_at_its_limits_is_told_so(db: None) -> None:
    org = make_org(tier="free")
    admin = make_user(org)
    make_stack(org, "only", bytes_used=11 * MB)
    page = client_for(admin).get(URL).content.decode()
    assert page.count('class="badge danger"') == 2
    assert "New students cannot be added" in page and "new memories are refused" in page


def test_an_unlimited_plan_has_no_gauge_and_no_chart(db: None) -> None:
    org = make_org(tier="enterprise")
    admin = make_user(org)
    make_stack(org, "one")
    page = client_for(admin).get(URL).content.decode()
    assert "No limit on your plan." in page and "<meter" not in page and "chart-usage" not in page


def test_an_unmapped_tier_is_a_503_page_not_a_guess(school: School) -> None:
    Organization.objects.filter(pk=school.org.pk).update(tier="platinum")
    response = client_for(school.admin).get(URL)
    assert response.status_code == 503


def test_who_may_see_it(school: School, other_school: School) -> None:
    billing = make_user(school.org, role=Membership.Role.BILLING)
    page = client_for(billing).get(URL).content.decode()
    assert school.org.name in page and other_school.org.name not in page
    assert client_for(school.teacher).get(URL).status_code == 404
    assert Client().get(URL).status_code == 302


# --- a billing user sees the billing page and nothing else ----------------------------------------

# Pages for anyone signed in (or about to be), not dashboard pages of a role.
FOR_EVERYONE = {"billing", "password-change", "invitation-accept"}
FOR_EVERYONE_PREFIXES = ("password-reset", "login", "logout")


def _dashboard_routes() -> list[tuple[str, list[str]]]:
    """(URL name, its keyword arguments) of every dashboard route, as dashboard/urls.py lists them."""
    from dashboard import urls

    routes: list[tuple[str, list[str]]] = []

    def walk(patterns: list[URLPattern | URLResolver]) -> None:
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns)
            elif pattern.name:
                routes.append((pattern.name, list(pattern.pattern.regex.groupindex)))

    walk(urls.urlpatterns)
    return routes


def test_every_other_dashboard_page_is_a_404_for_a_billing_user(school: School) -> None:
    from memories.models import Memory

    memory = memory_create(stack=school.stack, kind="note", payload={"content": "x"}, source="api")
    billing = make_user(school.org, role=Membership.Role.BILLING)
    client = client_for(billing)
    # Real identifiers of this school, so a 404 is the role's refusal, not a missing object.
    values = {"slug": school.stack.slug, "memory_id": str(memory.pk), "action": "forget",
              "key_id": school.agent_key.public_id, "member_id": str(school.teacher.pk),
              "user_id": str(school.teacher.pk), "kind": "note"}
    checked = []
    for name, kwargs in _dashboard_routes():
        if name in FOR_EVERYONE or name.startswith(FOR_EVERYONE_PREFIXES):
            continue
        url = reverse(f"dashboard:{name}", kwargs={k: values.get(k, "x") for k in kwargs})
        statuses = {}
        for method in ("get", "post"):
            response = getattr(client, method)(url)
            if name == "overview" and response.status_code == 302:
                assert response["Location"].endswith(URL)  # the overview sends billing users here
                continue
            statuses[method] = response.status_code
        # A page refuses a method it does not serve (405) before asking who is calling: that answer
        # is the same for every slug and every role, so it tells nothing. The method it serves: 404.
        assert set(statuses.values()) <= {404, 405} and (404 in statuses.values() or name == "overview"), \
            f"{url} answered {statuses}"
        checked.append(name)
    assert {"overview", "roster", "people", "keys", "audit", "student"} <= set(checked)
    assert Memory.objects.filter(pk=memory.pk, forgotten_at__isnull=True).exists()  # and nothing changed
    assert client.get(URL).status_code == 200
    # The navigation offers the billing page only.
    nav = client.get(URL).content.decode().split('aria-label="Main"')[1].split("</nav>")[0]
    assert re.findall(r'href="([^"]+)"', nav) == [URL]
