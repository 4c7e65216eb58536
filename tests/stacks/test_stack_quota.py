"""The tier's stack quota holds on every path that makes a stack active: the API (create and
unarchive), the seed command, kernle's first push and the Django admin. The dashboard only lists
stacks, so it has no such path. A free-tier school has one active stack, never two."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import OperationalError, connection
from django.test import Client

from accounts.models import Organization, User
from memoryhub.errors import QuotaExceeded
from stacks.models import Stack
from stacks.services import stack_archive, stack_create, stack_unarchive
from tests.factories import bearer_client, make_key, make_org, make_stack, other_connection

pytestmark = pytest.mark.django_db

FREE_LIMIT_MESSAGE = "stack limit reached (free: 1 syncing stack) — upgrade or archive a stack"


def active_stacks(org: Organization) -> int:
    return Stack.objects.filter(organization=org, status=Stack.Status.ACTIVE).count()


def assert_stack_limit_error(response: Any) -> None:
    assert response.status_code == 402, response.content
    error = response.json()["error"]
    assert error["code"] == "stack_limit_reached"
    assert error["message"] == FREE_LIMIT_MESSAGE
    assert error["fields"] == {"limit": "syncing_stacks", "tier": "free", "limit_stacks": 1}


def test_api_create_refuses_a_second_active_stack_on_the_free_tier() -> None:
    org = make_org(tier="free")
    school = bearer_client(make_key(org)[1])
    assert school.post("/api/v1/stacks/", {"stack_id": "first"}, format="json").status_code == 201
    assert_stack_limit_error(school.post("/api/v1/stacks/", {"stack_id": "second"}, format="json"))
    assert list(Stack.objects.filter(organization=org).values_list("slug", flat=True)) == ["first"]
    # Archiving frees the slot: the quota counts active stacks.
    assert school.post("/api/v1/stacks/first/archive").status_code == 200
    assert school.post("/api/v1/stacks/", {"stack_id": "second"}, format="json").status_code == 201
    assert active_stacks(org) == 1


def test_api_unarchive_refuses_when_the_tier_has_no_room() -> None:
    org = make_org(tier="free")
    school = bearer_client(make_key(org)[1])
    make_stack(org, "old", status=Stack.Status.ARCHIVED)
    make_stack(org, "current")
    assert_stack_limit_error(school.post("/api/v1/stacks/old/unarchive"))
    assert Stack.objects.get(organization=org, slug="old").status == Stack.Status.ARCHIVED
    assert active_stacks(org) == 1
    # Unarchiving a stack that is already active is still an idempotent 200, quota or not.
    assert school.post("/api/v1/stacks/current/unarchive").status_code == 200
    assert school.post("/api/v1/stacks/current/archive").status_code == 200
    assert school.post("/api/v1/stacks/old/unarchive").status_code == 200
    assert active_stacks(org) == 1


def test_services_enforce_the_quota_for_every_caller() -> None:
    org = make_org(tier="core")  # three active stacks
    stacks = [stack_create(organization=org, slug=f"s{n}") for n in range(3)]
    with pytest.raises(QuotaExceeded) as excinfo:
        stack_create(organization=org, slug="s3")
    assert excinfo.value.status == 402 and excinfo.value.code == "stack_limit_reached"
    stack_archive(stack=stacks[0])
    stack_create(organization=org, slug="s3")
    with pytest.raises(QuotaExceeded):
        stack_unarchive(stack=stacks[0])
    unlimited = make_org(tier="enterprise")
    for n in range(12):
        stack_create(organization=unlimited, slug=f"s{n}")
    assert active_stacks(unlimited) == 12


def test_seed_demo_creates_its_school_on_a_tier_with_room_and_fails_clearly_on_a_small_one() -> None:
    out = StringIO()
    call_command("seed_demo", "--students", "12", "--teachers", "1", stdout=out)
    demo = Organization.objects.get(slug="demo-school")
    assert demo.tier == "enterprise" and active_stacks(demo) == 12

    # A demo school from before (on the free tier, one stack) cannot be topped up past its limit.
    demo.delete()
    User.objects.filter(email__endswith="@demo-school.test").delete()
    small = make_org(tier="free")
    Organization.objects.filter(pk=small.pk).update(slug="demo-school")
    with pytest.raises(CommandError) as excinfo:
        call_command("seed_demo", "--students", "2", "--teachers", "0", stdout=StringIO())
    assert FREE_LIMIT_MESSAGE in str(excinfo.value) and "nothing was changed" in str(excinfo.value)
    assert not Stack.objects.filter(organization=small).exists()  # the whole seed rolled back


def test_create_school_makes_a_free_school_whose_admin_gets_one_active_stack() -> None:
    call_command("create_school", "Hill School", "--admin-email", "head@hill.test", "--slug", "hill",
                 "--password", "a-long-enough-password", stdout=StringIO())
    hill = Organization.objects.get(slug="hill")
    assert hill.tier == "free"
    admin = Client(enforce_csrf_checks=False)
    assert admin.login(username="head@hill.test", password="a-long-enough-password")
    assert admin.post("/api/v1/stacks/", {"stack_id": "one"}, content_type="application/json").status_code == 201
    assert_stack_limit_error(admin.post("/api/v1/stacks/", {"stack_id": "two"}, content_type="application/json"))


def kernle_push(client: Any, stack_id: str) -> dict[str, Any]:
    note = {"id": "n1", "content": "Fractions click with pizza diagrams", "note_type": "note",
            "created_at": None, "local_updated_at": None}
    response = client.post("/sync/push", {"stack_id": stack_id, "operations": [
        {"operation": "update", "table": "notes", "record_id": "n1", "local_updated_at": None, "version": 1,
         "data": note}]}, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def test_kernle_first_push_provisions_a_stack_only_within_the_quota() -> None:
    client = Client()
    registered = client.post("/auth/register", {"stack_id": "tutor", "email": "me@example.test"},
                             content_type="application/json")
    assert registered.status_code == 201, registered.content
    org = Organization.objects.get(stacks__slug="tutor")
    assert org.tier == "free" and active_stacks(org) == 1
    # The CLI's account-wide key (POST /auth/keys) may provision stacks by pushing to them.
    agent = bearer_client(registered.json()["secret"])
    account_key = agent.post("/auth/keys", {"name": "laptop"}, format="json").json()["key"]
    account = bearer_client(account_key)

    body = kernle_push(account, "second")
    assert body["synced"] == 0 and [c["error"] for c in body["conflicts"]] == [FREE_LIMIT_MESSAGE]
    assert not Stack.objects.filter(organization=org, slug="second").exists()

    stack_archive(stack=Stack.objects.get(organization=org, slug="tutor"))
    assert kernle_push(account, "second")["synced"] == 1
    assert active_stacks(org) == 1
    with pytest.raises(QuotaExceeded):
        stack_unarchive(stack=Stack.objects.get(organization=org, slug="tutor"))


def test_django_admin_cannot_add_a_stack_or_change_its_status_or_school() -> None:
    org = make_org(tier="free")
    archived = make_stack(org, "old", status=Stack.Status.ARCHIVED)
    make_stack(org, "current")
    staff = User.objects.create_superuser(username="root", email="root@example.test", password="pw-for-root-1")
    admin = Client()
    admin.force_login(staff)
    assert admin.get("/admin/stacks/stack/add/").status_code == 403
    response = admin.post(f"/admin/stacks/stack/{archived.pk}/change/", {
        "slug": "old", "display_name": "Renamed", "kind": "student", "status": "active",
        "organization": str(make_org(tier="enterprise").pk), "created_by": "",
        "teacher_assignments-TOTAL_FORMS": "0", "teacher_assignments-INITIAL_FORMS": "0",
        "teacher_assignments-MIN_NUM_FORMS": "0", "teacher_assignments-MAX_NUM_FORMS": "1000",
    })
    assert response.status_code == 302, response.content.decode()[-2000:]
    archived.refresh_from_db()
    assert archived.display_name == "Renamed"  # the descriptive fields stay editable
    assert archived.status == Stack.Status.ARCHIVED and archived.organization_id == org.pk
    assert active_stacks(org) == 1


@pytest.mark.django_db(transaction=True)
def test_stack_create_waits_for_the_organizations_quota_lock() -> None:
    """Two creates in one school are serialised on the organization row, so both cannot count the
    same free slot: while another transaction holds the lock, stack_create cannot proceed."""
    org = make_org(tier="free")
    holder = other_connection()
    try:
        with holder.cursor() as cursor:  # what a concurrent stack_create or kernle provisioning holds
            cursor.execute("SELECT 1 FROM accounts_organization WHERE id = %s FOR NO KEY UPDATE", [org.pk])
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '200ms'")
        try:
            with pytest.raises(OperationalError):
                stack_create(organization=org, slug="blocked")
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = 0")
    finally:
        holder.rollback()
        holder.close()
    stack_create(organization=org, slug="free-now")
    assert active_stacks(org) == 1
