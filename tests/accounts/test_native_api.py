"""Native keys, members and audit API (/api/v1/…)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from accounts.models import ApiKey, AuditEvent, Membership, Organization
from stacks.models import TeacherAssignment
from tests.accounts.clients import csrf_session_client
from tests.factories import assign_teacher, bearer_client, make_key, make_org, make_stack, make_user

pytestmark = pytest.mark.django_db


def test_admin_issues_lists_and_revokes_keys_with_audit() -> None:
    org = make_org()
    make_stack(org, "s1")
    admin = make_user(org)
    client = csrf_session_client(admin)
    expires = (timezone.now() + timedelta(days=30)).isoformat()
    issued = client.post("/api/v1/keys/", {"name": "tutor", "stack_id": "s1", "read_only": True,
                                           "expires_at": expires}, format="json")
    assert issued.status_code == 201, issued.content
    body = issued.json()
    assert body["key"].startswith("knl_sk_") and body["stack_id"] == "s1" and body["read_only"] is True
    assert body["expires_at"]
    # The secret works, bound and read-only; it is never shown again.
    agent = bearer_client(body["key"])
    assert agent.get("/api/v1/stacks/s1/").status_code == 200
    assert agent.patch("/api/v1/stacks/s1/", {"display_name": "x"}, format="json").status_code == 403
    listed = client.get("/api/v1/keys/").json()["results"]
    assert [k["id"] for k in listed] == [body["id"]] and "key" not in listed[0]
    assert client.get(f"/api/v1/keys/{body['id']}/").json()["last_used_at"] is not None
    assert client.delete(f"/api/v1/keys/{body['id']}/").status_code == 204
    assert agent.get("/api/v1/stacks/s1/").status_code == 401
    audit = client.get("/api/v1/audit/").json()["results"]
    assert [e["action"] for e in audit][:2] == ["key.revoked", "key.issued"]
    assert audit[0]["actor_id"] == admin.public_id and audit[0]["ip"] == "127.0.0.1"
    assert audit[0]["target_id"] == body["id"]


def test_school_wide_key_issue_needs_a_manager_and_past_expiry_is_refused() -> None:
    org = make_org()
    stack = make_stack(org, "s1")
    teacher = make_user(org, role=Membership.Role.TEACHER)
    assign_teacher(teacher, stack)
    teacher_client = csrf_session_client(teacher)
    assert teacher_client.post("/api/v1/keys/", {"name": "x"}, format="json").status_code == 403
    # A teacher may issue an agent key for an assigned student's stack when the school allows it
    # (tests/accounts/test_security.py covers the policy).
    Organization.objects.filter(pk=org.pk).update(teachers_may_manage_keys=True)
    assert teacher_client.post("/api/v1/keys/", {"stack_id": "s1"}, format="json").status_code == 201
    _, agent_secret = make_key(org, stack=stack)
    assert bearer_client(agent_secret).post("/api/v1/keys/", {"stack_id": "s1"}, format="json").status_code == 403
    admin = csrf_session_client(make_user(org))
    past = (timezone.now() - timedelta(days=1)).isoformat()
    assert admin.post("/api/v1/keys/", {"expires_at": past}, format="json").status_code == 400
    assert ApiKey.objects.filter(organization=org).count() == 2


def test_native_cycle_keeps_binding() -> None:
    org = make_org()
    stack = make_stack(org, "s1")
    key, _ = make_key(org, stack=stack, read_only=True)
    _, school_secret = make_key(org)
    response = bearer_client(school_secret).post(f"/api/v1/keys/{key.public_id}/cycle")
    assert response.status_code == 200
    new = ApiKey.objects.get(public_id=response.json()["id"])
    assert new.stack_id == stack.pk and new.read_only is True
    assert response.json()["old_key_id"] == key.public_id


def test_admin_creates_and_removes_members_and_removal_revokes_their_keys() -> None:
    org = make_org()
    stack = make_stack(org, "s1")
    admin = make_user(org)
    client = csrf_session_client(admin)
    created = client.post("/api/v1/members/", {"email": "t@school.test", "role": "teacher"}, format="json")
    assert created.status_code == 201, created.content
    member = created.json()
    assert member["role"] == "teacher" and len(member["initial_password"]) >= 12
    dup = client.post("/api/v1/members/", {"email": "T@School.test", "role": "billing"}, format="json")
    assert dup.status_code == 409
    bad = client.post("/api/v1/members/", {"email": "x@school.test", "role": "owner"}, format="json")
    assert bad.status_code == 400
    roles = sorted(m["role"] for m in client.get("/api/v1/members/").json()["results"])
    assert roles == ["admin", "teacher"]
    teacher = Membership.objects.get(user__public_id=member["user_id"]).user
    assert Client().login(username="t@school.test", password=member["initial_password"]) is True
    assign_teacher(teacher, stack)
    key, _ = make_key(org, stack=stack, user=teacher)
    assert client.delete(f"/api/v1/members/{member['user_id']}/").status_code == 204
    key.refresh_from_db()
    assert key.revoked_at is not None
    assert not TeacherAssignment.objects.filter(user=teacher).exists()
    assert client.delete(f"/api/v1/members/{member['user_id']}/").status_code == 404
    # The last admin stays.
    last = client.delete(f"/api/v1/members/{admin.public_id}/")
    assert last.status_code == 409
    actions = set(AuditEvent.objects.filter(organization=org).values_list("action", flat=True))
    assert {"member.added", "member.removed"} <= actions


@pytest.mark.parametrize("role", [Membership.Role.TEACHER, Membership.Role.BILLING])
def test_non_admins_cannot_list_members_or_read_audit_or_add_people(role: str) -> None:
    org = make_org()
    client = csrf_session_client(make_user(org, role=role))
    assert client.get("/api/v1/members/").status_code == 403
    assert client.get("/api/v1/audit/").status_code == 403
    assert client.post("/api/v1/members/", {"email": "n@x.test", "role": "admin"}, format="json").status_code == 403
    assert Membership.objects.filter(organization=org).count() == 1


def test_agent_key_cannot_read_members_or_audit() -> None:
    org = make_org()
    _, secret = make_key(org, stack=make_stack(org, "s1"))
    assert bearer_client(secret).get("/api/v1/members/").status_code == 403
    assert bearer_client(secret).get("/api/v1/audit/").status_code == 403


def test_audit_log_shows_only_the_own_schools_events() -> None:
    school_a, school_b = make_org(), make_org()
    make_key(school_a)
    make_key(school_b)
    _, secret_a = make_key(school_a)
    events = bearer_client(secret_a).get("/api/v1/audit/").json()["results"]
    # Each make_key adds its owner to the school, then issues the key: two events each.
    assert sorted(e["action"] for e in events) == ["key.issued", "key.issued", "member.added", "member.added"]
    assert set(AuditEvent.objects.filter(id__in=[e["id"] for e in events]).values_list(
        "organization_id", flat=True)) == {school_a.pk}
