"""Families in real Chromium (docs/guardians.md): an admin invites a parent from the student page's
Guardians panel (htmx), the parent joins from the link in their own browser, lands on "Your
children", reads their child's memories, and meets "no such page" everywhere else. Every page is
checked by tests/e2e/browser.py's `check_page` (axe-core, CSP, console, hosts, screenshot)."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

import pytest

from accounts.authors import Author, Path
from accounts.models import Membership
from memories.services import memory_create
from stacks.models import GuardianLink
from tests.e2e.browser import WatchedPage, check_page, sign_in
from tests.factories import make_org, make_stack, make_user

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PASSWORD = "correct horse battery staple"  # tests/factories.make_user's default


def test_a_parent_is_invited_joins_and_sees_only_their_child(open_page: Callable[[], WatchedPage],
                                                             dashboard_url: str) -> None:
    org = make_org("Riverside Primary")
    admin = make_user(org, role=Membership.Role.ADMIN, email="head@riverside.example", username="")
    child = make_stack(org, "mia-jones", display_name="Mia Jones")
    other = make_stack(org, "noah-king", display_name="Noah King")
    memory_create(stack=child, kind="note", payload={"content": "Mia likes fractions explained with pizza"},
                  source="api", author=Author(path=Path.API, agent="maths-tutor", key_name="Mia's tutor"))

    admin_page = open_page()
    sign_in(admin_page, dashboard_url, admin.email, PASSWORD)
    admin_page.goto(f"{dashboard_url}/dashboard/students/{child.slug}/")
    panel = admin_page.page.locator("#guardians")
    panel.get_by_label("Guardian's email").wait_for()  # the panel arrived through htmx
    check_page(admin_page, "student-guardians-panel")
    panel.get_by_label("Guardian's email").fill("parent@riverside.example")
    panel.get_by_label("Name (optional)").fill("Sam Jones")
    panel.get_by_role("button", name="Invite").click()
    admin_page.page.locator("#guardian-invitation-link").wait_for()
    check_page(admin_page, "student-guardian-invited")
    link = admin_page.page.locator("#guardian-invitation-link").inner_text().strip()
    assert urlsplit(link).path.startswith("/invitations/"), link

    watched = open_page()
    page = watched.page
    watched.goto(link.replace("http://127.0.0.1:", "http://localhost:"))
    check_page(watched, "guardian-invitation")
    page.get_by_label("New password").fill("kitchen-table-homework-7")
    page.get_by_label("Confirm password").fill("kitchen-table-homework-7")
    page.get_by_role("button", name="Join school").click()
    check_page(watched, "family-children")
    assert urlsplit(page.url).path == "/dashboard/family/"
    assert GuardianLink.objects.filter(user__email="parent@riverside.example", stack=child).exists()
    assert "Noah King" not in page.content()

    page.get_by_role("link", name="Mia Jones").click()
    check_page(watched, "family-child")
    assert "pizza" in page.content() and "maths-tutor" in page.content()
    page.get_by_role("searchbox", name="Search memories").fill("pizza")
    page.get_by_role("button", name="Search").click()
    check_page(watched, "family-child-search")
    assert page.get_by_role("list", name="Search results").get_by_role("listitem").count() == 1

    for name, path in (("family-other-child", f"/dashboard/family/{other.slug}/"),
                       ("family-staff-student-page", f"/dashboard/students/{child.slug}/"),
                       ("family-roster", "/dashboard/roster/")):
        assert watched.goto(f"{dashboard_url}{path}") == 404, path
        check_page(watched, name, status=404)
        assert "Noah King" not in page.content()
