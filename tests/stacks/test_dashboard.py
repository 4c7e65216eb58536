"""Dashboard sign-in with sessions and CSRF, and the stack list behind stacks_visible_to."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from accounts.models import AuditEvent, Membership
from tests.factories import assign_teacher, make_org, make_stack, make_user

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery staple"


def csrf_from(page: bytes) -> str:
    match = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert match, page
    return match.group(1).decode()


def test_login_requires_csrf_and_then_shows_only_visible_stacks() -> None:
    org = make_org()
    mine, other = make_stack(org, "student-mine"), make_stack(org, "student-other")
    make_stack(make_org(), "student-foreign")
    teacher = make_user(org, role=Membership.Role.TEACHER, password=PASSWORD)
    assign_teacher(teacher, mine)
    client = Client(enforce_csrf_checks=True)
    assert client.get("/dashboard/").status_code == 302  # to /login/
    page = client.get("/login/")
    assert page.status_code == 200
    no_token = client.post("/login/", {"username": teacher.username, "password": PASSWORD})
    assert no_token.status_code == 403
    wrong = client.post("/login/", {"username": teacher.username, "password": "nope",
                                    "csrfmiddlewaretoken": csrf_from(page.content)})
    assert wrong.status_code == 200 and b"Wrong email or password" in wrong.content
    good = client.post("/login/", {"username": teacher.username, "password": PASSWORD,
                                   "csrfmiddlewaretoken": csrf_from(client.get("/login/").content)})
    assert good.status_code == 302 and good["Location"] == "/dashboard/"
    dashboard = client.get("/dashboard/")
    assert dashboard.status_code == 200
    assert b"student-mine" in dashboard.content
    assert b"student-other" not in dashboard.content and b"student-foreign" not in dashboard.content
    assert other.slug not in dashboard.content.decode()
    actions = list(AuditEvent.objects.filter(organization=org).values_list("action", "ip"))
    assert ("login.failed", "127.0.0.1") in actions and ("login.succeeded", "127.0.0.1") in actions
    logout = client.post("/logout/", {"csrfmiddlewaretoken": csrf_from(dashboard.content)})
    assert logout.status_code == 302
    assert client.get("/dashboard/").status_code == 302


def test_admin_dashboard_lists_every_stack_of_the_school() -> None:
    org = make_org()
    for slug in ("s-1", "s-2"):
        make_stack(org, slug)
    client = Client()
    client.force_login(make_user(org))
    content = client.get("/dashboard/").content
    assert b"s-1" in content and b"s-2" in content


@pytest.mark.parametrize("username", ["a\x00b", "x" * 5000, ""])
def test_hostile_login_form_input_is_a_form_error_not_a_500(username: str) -> None:
    client = Client()
    response = client.post("/login/", {"username": username, "password": "p\x00"})
    assert response.status_code == 200
    assert not AuditEvent.objects.exists()
