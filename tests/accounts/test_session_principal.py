"""principal_for_session: the one Principal a signed-in dashboard user acts as, for the session API
and the dashboard pages alike."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from accounts.models import Membership
from accounts.selectors import principal_for_session
from tests.factories import assign_teacher, make_org, make_stack, make_user

pytestmark = pytest.mark.django_db


def test_a_member_acts_with_their_schools_role_and_a_session_credential() -> None:
    org = make_org()
    teacher = make_user(org, role=Membership.Role.TEACHER)
    principal = principal_for_session(teacher)
    assert principal is not None
    assert principal.organization == org and principal.role == Membership.Role.TEACHER
    assert principal.api_key is None and not principal.read_only and not principal.is_org_wide
    assert principal.credential_id == f"session:{teacher.public_id}"


def test_a_user_in_no_school_has_no_principal() -> None:
    assert principal_for_session(make_user()) is None


def test_the_session_api_and_the_dashboard_see_the_same_stacks() -> None:
    org = make_org()
    teacher = make_user(org, role=Membership.Role.TEACHER, password="correct horse battery staple")
    assign_teacher(teacher, make_stack(org, "mine"))
    make_stack(org, "not-mine")
    client = APIClient()
    client.force_login(teacher)
    api_stacks = [s["stack_id"] for s in client.get("/api/v1/stacks/").json()["results"]]
    page = client.get("/dashboard/").content.decode()
    assert api_stacks == ["mine"]
    assert 'data-stack="mine"' in page and 'data-stack="not-mine"' not in page
