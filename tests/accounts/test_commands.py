"""create_school and seed_demo management commands."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client

from accounts.models import ApiKey, Membership, Organization
from stacks.models import Stack, TeacherAssignment
from tests.factories import bearer_client

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_create_school_prints_a_working_admin_login_and_is_idempotent() -> None:
    output = run("create_school", "Lincoln High", "--admin-email", "head@lincoln.test", "--slug", "lincoln")
    password = re.search(r"password:\s+(\S+)", output).group(1)  # type: ignore[union-attr]
    org = Organization.objects.get(slug="lincoln")
    assert org.kind == "school"
    membership = Membership.objects.get(organization=org)
    assert membership.role == "admin" and membership.user.email == "head@lincoln.test"
    assert Client().login(username="head@lincoln.test", password=password)
    again = run("create_school", "Lincoln High", "--admin-email", "head@lincoln.test", "--slug", "lincoln")
    assert "already exists" in again and Organization.objects.count() == 1
    with pytest.raises(CommandError):
        run("create_school", "Lincoln High", "--admin-email", "other@lincoln.test", "--slug", "lincoln")


def test_seed_demo_creates_a_school_with_teachers_stacks_and_working_keys_idempotently() -> None:
    output = run("seed_demo", "--students", "4", "--teachers", "2")
    org = Organization.objects.get(slug="demo-school")
    assert Stack.objects.filter(organization=org).count() == 4
    assert TeacherAssignment.objects.filter(stack__organization=org).count() == 4
    roles = sorted(Membership.objects.filter(organization=org).values_list("role", flat=True))
    assert roles == ["admin", "billing", "teacher", "teacher"]
    secrets = re.findall(r"knl_sk_[0-9a-f]{32}", output)
    assert len(secrets) == 5  # one school key + one per student
    agent = re.search(r"agent key for student-0001: (knl_sk_\w+)", output).group(1)  # type: ignore[union-attr]
    response = bearer_client(agent).get("/api/v1/stacks/")
    assert [s["stack_id"] for s in response.json()["results"]] == ["student-0001"]
    again = run("seed_demo", "--students", "4", "--teachers", "2")
    assert not re.findall(r"knl_sk_", again)  # nothing new to show
    assert ApiKey.objects.filter(organization=org).count() == 5
    assert Stack.objects.filter(organization=org).count() == 4
