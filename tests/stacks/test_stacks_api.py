"""The native stacks API and the access rules behind it."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from accounts.models import AuditEvent, Membership
from accounts.principal import Principal
from memoryhub.errors import Conflict, Forbidden
from stacks.models import Stack
from stacks.selectors import ensure_writable, stack_for_principal
from stacks.services import stack_archive
from tests.accounts.clients import csrf_session_client
from tests.factories import assign_teacher, bearer_client, make_key, make_org, make_stack, make_user

pytestmark = pytest.mark.django_db


def slugs(response) -> list[str]:
    assert response.status_code == 200, response.content
    return sorted(item["stack_id"] for item in response.json()["results"])


def test_admin_session_creates_lists_updates_and_archives_a_stack() -> None:
    org = make_org()
    admin = make_user(org)
    client = csrf_session_client(admin)
    created = client.post("/api/v1/stacks/", {"stack_id": "student-4521", "display_name": "Ada", "kind": "student"},
                          format="json")
    assert created.status_code == 201, created.content
    assert created.json()["stack_id"] == "student-4521" and created.json()["status"] == "active"
    assert slugs(client.get("/api/v1/stacks/")) == ["student-4521"]
    patched = client.patch("/api/v1/stacks/student-4521/", {"display_name": "Ada L."}, format="json")
    assert patched.status_code == 200 and patched.json()["display_name"] == "Ada L."
    archived = client.post("/api/v1/stacks/student-4521/archive")
    assert archived.status_code == 200 and archived.json()["status"] == "archived"
    assert archived.json()["archived_at"]
    assert client.post("/api/v1/stacks/student-4521/archive").status_code == 200  # idempotent
    assert slugs(client.get("/api/v1/stacks/?status=archived")) == ["student-4521"]
    assert slugs(client.get("/api/v1/stacks/?status=active")) == []
    # Archived: refuses writes with a clear 409, keeps data; reading still works.
    refused = client.patch("/api/v1/stacks/student-4521/", {"display_name": "x"}, format="json")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "stack_archived"
    assert client.get("/api/v1/stacks/student-4521/").json()["display_name"] == "Ada L."
    restored = client.post("/api/v1/stacks/student-4521/unarchive")
    assert restored.status_code == 200 and restored.json()["status"] == "active"
    actions = list(AuditEvent.objects.filter(organization=org).values_list("action", "target_id", "ip", "actor"))
    assert ("stack.created", "student-4521", "127.0.0.1", admin.pk) in actions
    assert ("stack.archived", "student-4521", "127.0.0.1", admin.pk) in actions


def test_session_writes_without_csrf_token_are_refused() -> None:
    org = make_org()
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(make_user(org))
    response = client.post("/api/v1/stacks/", {"stack_id": "s"}, format="json")
    assert response.status_code == 403
    assert not Stack.objects.exists()


def test_school_key_manages_stacks_and_duplicate_or_bad_ids_are_refused() -> None:
    org = make_org()
    _, secret = make_key(org)
    client = bearer_client(secret)
    assert client.post("/api/v1/stacks/", {"stack_id": "a"}, format="json").status_code == 201
    dup = client.post("/api/v1/stacks/", {"stack_id": "a"}, format="json")
    assert dup.status_code == 409 and dup.json()["error"]["code"] == "stack_exists"
    for bad in ["a/b", "..", "x" * 101, "", "has space"]:
        response = client.post("/api/v1/stacks/", {"stack_id": bad}, format="json")
        assert response.status_code == 400, (bad, response.content)
    assert client.post("/api/v1/stacks/", {"stack_id": "b", "kind": "robot"}, format="json").status_code == 400
    assert list(Stack.objects.values_list("slug", flat=True)) == ["a"]


def test_the_same_stack_id_in_two_schools_are_two_stacks() -> None:
    school_a, school_b = make_org(), make_org()
    make_stack(school_a, "student-1", display_name="A's")
    make_stack(school_b, "student-1", display_name="B's")
    _, secret_b = make_key(school_b)
    assert bearer_client(secret_b).get("/api/v1/stacks/student-1/").json()["display_name"] == "B's"


def test_teacher_sees_only_assigned_stacks_and_cannot_manage() -> None:
    org = make_org()
    mine, other = make_stack(org, "mine"), make_stack(org, "other")
    teacher = make_user(org, role=Membership.Role.TEACHER)
    assign_teacher(teacher, mine)
    client = csrf_session_client(teacher)
    assert slugs(client.get("/api/v1/stacks/")) == ["mine"]
    assert client.get("/api/v1/stacks/mine/").status_code == 200
    assert client.get("/api/v1/stacks/other/").status_code == 404
    assert client.post("/api/v1/stacks/", {"stack_id": "new"}, format="json").status_code == 403
    assert client.post("/api/v1/stacks/mine/archive").status_code == 403
    assert client.patch("/api/v1/stacks/mine/", {"display_name": "x"}, format="json").status_code == 403
    mine.refresh_from_db()
    other.refresh_from_db()
    assert mine.status == other.status == "active" and mine.display_name == ""
    assert Stack.objects.count() == 2


def test_billing_user_sees_no_stacks() -> None:
    org = make_org()
    make_stack(org, "s1")
    client = csrf_session_client(make_user(org, role=Membership.Role.BILLING))
    assert slugs(client.get("/api/v1/stacks/")) == []
    assert client.get("/api/v1/stacks/s1/").status_code == 404


def test_stack_bound_key_sees_only_its_stack_and_cannot_manage_it() -> None:
    org = make_org()
    own, _ = make_stack(org, "own"), make_stack(org, "sibling")
    _, secret = make_key(org, stack=own)
    client = bearer_client(secret)
    assert slugs(client.get("/api/v1/stacks/")) == ["own"]
    assert client.get("/api/v1/stacks/sibling/").status_code == 404
    assert client.post("/api/v1/stacks/own/archive").status_code == 403
    assert client.post("/api/v1/stacks/", {"stack_id": "x"}, format="json").status_code == 403
    assert Stack.objects.count() == 2 and Stack.objects.get(slug="own").status == "active"


def test_read_only_school_key_reads_but_cannot_write() -> None:
    org = make_org()
    make_stack(org, "s1")
    _, secret = make_key(org, read_only=True)
    client = bearer_client(secret)
    assert slugs(client.get("/api/v1/stacks/")) == ["s1"]
    assert client.post("/api/v1/stacks/", {"stack_id": "s2"}, format="json").status_code == 403
    assert client.patch("/api/v1/stacks/s1/", {"display_name": "x"}, format="json").status_code == 403
    assert client.post("/api/v1/stacks/s1/archive").status_code == 403
    assert list(Stack.objects.values_list("slug", "status", "display_name")) == [("s1", "active", "")]


def test_archived_stack_refuses_writes_through_the_selectors_and_keeps_data() -> None:
    org = make_org()
    stack = make_stack(org, "s1", display_name="kept")
    key, _ = make_key(org, stack=stack)
    principal = Principal(user=key.user, organization=org, api_key=key, bound_stack_id=stack.pk)
    stack_archive(stack=stack)
    with pytest.raises(Conflict):
        stack_for_principal(principal, "s1", write=True)
    assert stack_for_principal(principal, "s1").display_name == "kept"
    ro = Principal(user=key.user, organization=org, api_key=key, bound_stack_id=stack.pk, read_only=True)
    with pytest.raises(Forbidden):
        ensure_writable(ro, stack)


def test_teacher_assignment_api() -> None:
    org = make_org()
    make_stack(org, "s1")
    teacher = make_user(org, role=Membership.Role.TEACHER)
    billing = make_user(org, role=Membership.Role.BILLING)
    stranger = make_user(make_org(), role=Membership.Role.TEACHER)
    client = csrf_session_client(make_user(org))
    assert client.post("/api/v1/stacks/s1/teachers/", {"user_id": teacher.public_id}, format="json").status_code == 201
    assert client.get("/api/v1/stacks/s1/teachers/").json() == [{"user_id": teacher.public_id}]
    assert csrf_session_client(teacher).get("/api/v1/stacks/s1/").status_code == 200
    assert client.post("/api/v1/stacks/s1/teachers/", {"user_id": billing.public_id},
                       format="json").status_code == 400
    assert client.post("/api/v1/stacks/s1/teachers/", {"user_id": stranger.public_id},
                       format="json").status_code == 404
    assert client.delete(f"/api/v1/stacks/s1/teachers/{teacher.public_id}/").status_code == 204
    assert csrf_session_client(teacher).get("/api/v1/stacks/s1/").status_code == 404
