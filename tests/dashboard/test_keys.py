"""The Keys page: an admin (or, when the school allows it, a teacher for their students) issues a
stack-bound, school-wide or read-only key with an optional expiry; the secret is shown once with
the lines that use it; keys are listed, revoked and cycled. Nobody else reaches any key page."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from accounts.models import ApiKey, AuditEvent, Membership
from accounts.services import api_key_revoke
from tests.actors import School
from tests.dashboard.pages import client_for, csrf_token
from tests.factories import bearer_client, make_key, make_user

pytestmark = pytest.mark.django_db

URL = "/dashboard/keys/"
SECRET = re.compile(r'<code id="new-key-secret">(knl_sk_[0-9a-f]{32})</code>')


def issue(client: Client, **fields: str) -> tuple[ApiKey, str, str]:
    """Issue through the page; returns the key, its secret and the page."""
    response = client.post(URL, {"name": "laptop", "scope": "", **fields})
    assert response.status_code == 201, response.content.decode()
    page = response.content.decode()
    secret = SECRET.search(page).group(1)  # type: ignore[union-attr]
    return ApiKey.objects.get(key_prefix=secret[:12]), secret, page


def allow_teacher_keys(school: School) -> None:
    school.org.teachers_may_manage_keys = True
    school.org.save(update_fields=["teachers_may_manage_keys"])


# --- the list ----------------------------------------------------------------------------------


def test_the_list_shows_name_prefix_scope_expiry_and_status_but_never_a_secret(school: School) -> None:
    expired, _ = make_key(school.org, stack=school.other_stack, user=school.admin, name="old tutor")
    ApiKey.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(days=1))
    revoked, _ = make_key(school.org, stack=school.stack, user=school.admin, name="lost laptop", read_only=True)
    api_key_revoke(key=revoked)

    response = client_for(school.admin).get(URL)

    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    page = response.content.decode()
    row = re.search(rf'<tr data-key="{school.agent_key.public_id}">(.*?)</tr>', page, re.S).group(1)  # type: ignore[union-attr]
    assert "agent key" in row and f"{school.agent_key.key_prefix}…" in row and "alice" in row
    assert 'badge ok">active' in row and "Revoke" in row and "Cycle" in row
    school_row = re.search(rf'<tr data-key="{school.admin_key.public_id}">(.*?)</tr>', page, re.S).group(1)  # type: ignore[union-attr]
    assert "school-wide" in school_row
    assert re.search(rf'data-key="{expired.public_id}">.*?badge warn">expired', page, re.S)
    revoked_row = re.search(rf'<tr data-key="{revoked.public_id}">(.*?)</tr>', page, re.S).group(1)  # type: ignore[union-attr]
    assert 'badge danger">revoked' in revoked_row and "read-only" in revoked_row and "Revoke" not in revoked_row
    for secret in (school.admin_secret, school.agent_secret):
        assert secret not in page
    assert school.agent_key.key_hash not in page
    assert 'id="new-key-secret"' not in page


@pytest.mark.parametrize("who", ["teacher", "billing"])
def test_teachers_without_the_school_policy_and_billing_users_get_404_on_every_key_page(
        school: School, who: str) -> None:
    user = school.teacher if who == "teacher" else make_user(school.org, role=Membership.Role.BILLING)
    client = client_for(user)
    key_id = school.agent_key.public_id
    assert client.get(URL).status_code == 404
    assert client.post(URL, {"name": "x", "scope": "alice"}).status_code == 404
    assert client.post(f"/dashboard/keys/{key_id}/revoke").status_code == 404
    assert client.post(f"/dashboard/keys/{key_id}/cycle").status_code == 404
    assert ApiKey.objects.filter(revoked_at__isnull=True).count() == 2
    assert not ApiKey.objects.filter(name="x").exists()


def test_another_schools_keys_are_404_and_never_listed(school: School, other_school: School) -> None:
    admin = client_for(school.admin)
    theirs = other_school.agent_key.public_id
    assert admin.post(f"/dashboard/keys/{theirs}/revoke").status_code == 404
    assert admin.post(f"/dashboard/keys/{theirs}/cycle").status_code == 404
    assert admin.post(URL, {"name": "x", "scope": "carol"}).status_code == 400  # not a scope it may choose
    assert theirs not in admin.get(URL).content.decode()
    assert bearer_client(other_school.agent_secret).get("/api/v1/stacks/carol/").status_code == 200


# --- issuing -----------------------------------------------------------------------------------


def test_an_issued_key_is_shown_once_with_the_lines_that_use_it_and_works(school: School) -> None:
    admin = client_for(school.admin, csrf=True)
    expires_on = (timezone.now() + timedelta(days=30)).date()
    response = admin.post(URL, {"name": "alice tutor", "scope": "alice", "read_only": "on",
                                "expires_on": expires_on.isoformat(),
                                "csrfmiddlewaretoken": csrf_token(admin, URL)})

    assert response.status_code == 201
    assert "no-store" in response["Cache-Control"]
    page = response.content.decode()
    secret = SECRET.search(page).group(1)  # type: ignore[union-attr]
    assert 'data-copy="#new-key-secret"' in page
    assert 'kernle auth login --api-key &quot;$MEMORYHUB_KEY&quot; --backend-url &quot;$MEMORYHUB_URL&quot;' in page
    assert f"export MEMORYHUB_URL=http://testserver MEMORYHUB_KEY={secret}" in page
    assert "export KERNLE_STACK_ID=alice" in page
    assert "curl -s &quot;$MEMORYHUB_URL/api/v1/stacks/alice/load&quot;" in page
    key = ApiKey.objects.get(key_prefix=secret[:12])
    assert (key.name, key.stack, key.read_only, key.user) == ("alice tutor", school.stack, True, school.admin)
    assert key.expires_at is not None and key.expires_at.date() == expires_on
    assert AuditEvent.objects.filter(action="key.issued", target_id=key.public_id, actor=school.admin).exists()

    agent = bearer_client(secret)
    assert agent.get("/api/v1/stacks/alice/load").status_code == 200
    assert agent.get("/api/v1/stacks/bob/").status_code == 404  # bound to alice
    assert agent.post("/api/v1/stacks/alice/memories", {"kind": "note", "content": "x"},
                      format="json").status_code == 403  # read-only

    # Shown once: not on the next visit, not in the session, not in a message.
    again = admin.get(URL)
    assert secret not in again.content.decode()
    assert all(secret not in str(value) for value in admin.session.values())


def test_a_school_wide_key_reaches_every_stack(school: School) -> None:
    key, secret, page = issue(client_for(school.admin), name="report tool")
    assert key.stack is None and not key.read_only and key.expires_at is None
    assert "export KERNLE_STACK_ID=&lt;a stack of the school&gt;" in page
    for slug in ("alice", "bob"):
        assert bearer_client(secret).get(f"/api/v1/stacks/{slug}/").status_code == 200


@pytest.mark.parametrize("fields, error", [
    ({"name": "", "scope": "alice"}, "This field is required."),
    ({"name": "x", "scope": "nobody"}, "Select a valid choice."),
    ({"name": "x", "scope": "alice", "expires_on": "2001-01-01"}, "Choose a day after today."),
    ({"name": "x", "scope": "alice", "expires_on": "tomorrow"}, "Enter a valid date."),
    ({"name": "x" * 101, "scope": ""}, "at most 100 characters"),
])
def test_invalid_input_is_a_400_with_the_error_and_issues_nothing(school: School, fields: dict[str, str],
                                                                    error: str) -> None:
    before = ApiKey.objects.count()
    response = client_for(school.admin).post(URL, fields)
    assert response.status_code == 400
    page = response.content.decode()
    assert error in page and 'id="new-key-secret"' not in page
    assert ApiKey.objects.count() == before


def test_an_archived_stack_is_not_offered_as_a_scope(school: School) -> None:
    from stacks.services import stack_archive

    stack_archive(stack=school.other_stack)
    page = client_for(school.admin).get(URL).content.decode()
    assert '<option value="alice">alice</option>' in page and '<option value="" selected>School-wide</option>' in page
    assert '<option value="bob">' not in page


# --- revoking and cycling ----------------------------------------------------------------------


def test_a_revoked_key_gets_401_and_shows_as_revoked(school: School) -> None:
    admin = client_for(school.admin, csrf=True)
    response = admin.post(f"/dashboard/keys/{school.agent_key.public_id}/revoke",
                          {"csrfmiddlewaretoken": csrf_token(admin, URL)})
    assert response.status_code == 302 and response["Location"] == URL
    assert school.agent.get("/api/v1/stacks/alice/").status_code == 401
    page = admin.get(URL).content.decode()
    assert "was revoked" in page
    assert re.search(rf'data-key="{school.agent_key.public_id}">.*?badge danger">revoked', page, re.S)
    assert AuditEvent.objects.filter(action="key.revoked", target_id=school.agent_key.public_id).exists()


def test_cycling_shows_the_new_secret_once_and_the_old_one_stops_working(school: School) -> None:
    admin = client_for(school.admin)
    response = admin.post(f"/dashboard/keys/{school.agent_key.public_id}/cycle")

    assert response.status_code == 201 and "no-store" in response["Cache-Control"]
    page = response.content.decode()
    secret = SECRET.search(page).group(1)  # type: ignore[union-attr]
    assert "stopped working" in page
    assert school.agent.get("/api/v1/stacks/alice/").status_code == 401
    assert bearer_client(secret).get("/api/v1/stacks/alice/").status_code == 200
    new_key = ApiKey.objects.get(key_prefix=secret[:12])
    assert (new_key.stack, new_key.name) == (school.stack, "agent key")
    assert secret not in admin.get(URL).content.decode()
    # A revoked key cannot be cycled.
    assert admin.post(f"/dashboard/keys/{school.agent_key.public_id}/cycle").status_code == 400


def test_without_the_csrf_token_nothing_is_revoked(school: School) -> None:
    response = client_for(school.admin, csrf=True).post(f"/dashboard/keys/{school.agent_key.public_id}/revoke")
    assert response.status_code == 403
    assert school.agent.get("/api/v1/stacks/alice/").status_code == 200


# --- teachers, when the school allows it ---------------------------------------------------------


def test_a_teacher_with_the_policy_issues_keys_for_assigned_stacks_only(school: School) -> None:
    allow_teacher_keys(school)
    teacher = client_for(school.teacher)
    page = teacher.get(URL).content.decode()
    assert '<option value="alice">alice</option>' in page
    assert "School-wide" not in page and '<option value="bob">' not in page
    assert school.agent_key.public_id in page  # keys of the assigned stack
    assert school.admin_key.public_id not in page  # not the school key

    key, secret, _ = issue(teacher, name="tutor", scope="alice")
    assert key.user == school.teacher and key.stack == school.stack
    assert teacher.post(URL, {"name": "x", "scope": ""}).status_code == 400
    assert teacher.post(URL, {"name": "x", "scope": "bob"}).status_code == 400
    # A key issued to the admin is visible but not theirs to revoke or cycle.
    row = re.search(rf'<tr data-key="{school.agent_key.public_id}">(.*?)</tr>', teacher.get(URL).content.decode(),
                    re.S).group(1)  # type: ignore[union-attr]
    assert "Revoke" not in row and "Cycle" not in row
    assert teacher.post(f"/dashboard/keys/{school.agent_key.public_id}/cycle").status_code == 403
    assert teacher.post(f"/dashboard/keys/{key.public_id}/revoke").status_code == 302
    assert bearer_client(secret).get("/api/v1/stacks/alice/").status_code == 401


# --- what a key reads: its issuer's grants, or the student's own agent by a named choice ----------


STACK_AGENT_LABEL = "This key is the student&#x27;s own agent — it reads memories shared only with the student"


def test_the_student_s_own_agent_is_a_named_choice_off_by_default(school: School) -> None:
    admin = client_for(school.admin)
    page = admin.get(URL).content.decode()
    assert STACK_AGENT_LABEL in page and 'name="stack_agent"' in page and 'name="stack_agent" checked' not in page
    plain, _, _ = issue(admin, name="helper", scope="alice")
    agent, _, _ = issue(admin, name="tutor", scope="alice", stack_agent="on")
    assert (plain.stack_agent, agent.stack_agent) == (False, True)
    assert list(AuditEvent.objects.filter(action="key.issued_as_stack_agent", target_id__in=[
        plain.public_id, agent.public_id]).values_list("target_id", "actor")) == [(agent.public_id, school.admin.pk)]
    rows = admin.get(URL).content.decode()
    agent_row = re.search(rf'<tr data-key="{agent.public_id}">(.*?)</tr>', rows, re.S).group(1)  # type: ignore[union-attr]
    plain_row = re.search(rf'<tr data-key="{plain.public_id}">(.*?)</tr>', rows, re.S).group(1)  # type: ignore[union-attr]
    assert "student's own agent" in agent_row and "what its issuer may read" in plain_row
    # Only for a stack: a school-wide key cannot be a student's agent.
    before = ApiKey.objects.count()
    refused = admin.post(URL, {"name": "x", "scope": "", "stack_agent": "on"})
    assert refused.status_code == 400 and "Only a key bound to a student" in refused.content.decode()
    assert ApiKey.objects.count() == before


def test_a_teacher_is_not_offered_the_choice_and_cannot_make_it(school: School) -> None:
    allow_teacher_keys(school)
    teacher = client_for(school.teacher)
    assert 'name="stack_agent"' not in teacher.get(URL).content.decode()
    key, _, _ = issue(teacher, name="tutor", scope="alice", stack_agent="on")  # the field is not there: ignored
    assert key.stack_agent is False


def test_an_admin_is_not_offered_to_cycle_a_key_that_reads_what_a_teacher_reads(school: School) -> None:
    allow_teacher_keys(school)
    key, _, _ = issue(client_for(school.teacher), name="tutor", scope="alice")
    admin = client_for(school.admin)
    row = re.search(rf'<tr data-key="{key.public_id}">(.*?)</tr>', admin.get(URL).content.decode(),
                    re.S).group(1)  # type: ignore[union-attr]
    assert "Revoke" in row and "Cycle" not in row
    assert admin.post(f"/dashboard/keys/{key.public_id}/cycle").status_code == 403
