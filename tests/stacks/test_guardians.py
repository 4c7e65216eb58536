"""Guardians through the API (docs/guardians.md): a school admin invites a parent for a student and gets
the one-time link; accepting it links the guardian to exactly the students the invitation names;
listing, unlinking and who is refused (a teacher 403, another school 404)."""

from __future__ import annotations

import re

import pytest
from django.core import mail
from django.test import Client

from accounts.invitations import token_hash
from accounts.models import AuditEvent, Invitation, Membership, User
from stacks.models import GuardianLink
from tests.accounts.clients import csrf_session_client
from tests.actors import School
from tests.factories import bearer_client, make_key, make_user

pytestmark = pytest.mark.django_db

PASSWORDS = {"password1": "a long and new passphrase", "password2": "a long and new passphrase"}
TOKEN = re.compile(r"/invitations/([A-Za-z0-9_-]+)/$")


def invite(school: School, slug: str, email: str, name: str = "") -> dict:
    response = school.admin_api.post(f"/api/v1/stacks/{slug}/guardians", {"email": email, "name": name},
                                     format="json")
    assert response.status_code in (200, 201), response.content
    return response.json()


def accept(url: str) -> Client:
    match = TOKEN.search(url)
    assert match
    client = Client()
    response = client.post(f"/invitations/{match.group(1)}/", PASSWORDS)
    assert response.status_code == 302, response.content.decode()
    return client


def test_an_invitation_links_the_guardian_to_every_student_it_names_and_no_other(school: School) -> None:
    first = invite(school, school.stack.slug, "Parent@Example.test", name="Pat Parent")
    assert first["status"] == "invited" and first["invitation_url"].startswith("http")
    invitation = Invitation.objects.get(public_id=first["invitation_id"])
    found = TOKEN.search(first["invitation_url"])
    assert found is not None
    token = found.group(1)
    assert invitation.token_hash == token_hash(token) and invitation.role == "guardian"
    assert first["emailed"] and first["invitation_url"] in mail.outbox[0].body
    # A second child of the same family joins the pending invitation: the link they have covers both.
    second = invite(school, school.other_stack.slug, "parent@example.test")
    assert (second["status"], second["invitation_url"], second["invitation_id"]) == (
        "added_to_pending", None, first["invitation_id"])
    assert len(mail.outbox) == 1
    page = Client().get(f"/invitations/{token}/").content.decode()
    assert "guardian of <strong>alice, bob</strong>" in page  # the children it is for, before joining

    accept(first["invitation_url"])

    parent = User.objects.get(email__iexact="parent@example.test")
    assert parent.get_full_name() == "Pat Parent"
    assert Membership.objects.get(user=parent, organization=school.org).role == "guardian"
    assert set(GuardianLink.objects.filter(user=parent).values_list("stack__slug", flat=True)) == {"alice", "bob"}
    actions = list(AuditEvent.objects.filter(organization=school.org).values_list("action", flat=True))
    assert actions.count("guardian.invited") == 2 and actions.count("guardian.linked") == 2


def test_an_existing_guardian_is_linked_at_once_and_the_list_shows_them(school: School) -> None:
    guardian = make_user(school.org, role=Membership.Role.GUARDIAN, email="known@example.test",
                         first_name="Kim", last_name="Known")
    answer = school.admin_api.post(f"/api/v1/stacks/{school.stack.slug}/guardians",
                                   {"email": "KNOWN@example.test"}, format="json")
    assert answer.status_code == 200 and answer.json()["status"] == "linked"
    assert answer.json()["invitation_url"] is None
    invite(school, school.stack.slug, "pending@example.test", name="Pen Ding")

    listed = school.admin_api.get(f"/api/v1/stacks/{school.stack.slug}/guardians")

    assert listed.status_code == 200
    rows = {row["email"]: row for row in listed.json()}
    assert rows["known@example.test"]["state"] == "accepted" and rows["known@example.test"]["name"] == "Kim Known"
    assert rows["known@example.test"]["user_id"] == guardian.public_id and rows["known@example.test"]["linked_at"]
    assert rows["pending@example.test"]["state"] == "pending" and rows["pending@example.test"]["linked_at"] is None
    # The other student's list is empty: links are per student.
    assert school.admin_api.get(f"/api/v1/stacks/{school.other_stack.slug}/guardians").json() == []


def test_unlinking_takes_the_student_out_of_the_guardians_reach(school: School) -> None:
    guardian = make_user(school.org, role=Membership.Role.GUARDIAN)
    invite(school, school.stack.slug, guardian.email)
    session = csrf_session_client(guardian)
    assert session.get(f"/api/v1/stacks/{school.stack.slug}/").status_code == 200

    gone = school.admin_api.delete(f"/api/v1/stacks/{school.stack.slug}/guardians/{guardian.public_id}")

    assert gone.status_code == 204
    assert session.get(f"/api/v1/stacks/{school.stack.slug}/").status_code == 404
    assert school.admin_api.delete(
        f"/api/v1/stacks/{school.stack.slug}/guardians/{guardian.public_id}").status_code == 404
    assert AuditEvent.objects.filter(organization=school.org, action="guardian.unlinked").count() == 1


def test_a_teacher_and_a_read_only_key_are_refused_and_another_school_gets_404(school: School,
                                                                              other_school: School) -> None:
    teacher = csrf_session_client(school.teacher)  # assigned to alice: sees the stack, may not manage it
    for method, body in (("get", None), ("post", {"email": "t@example.test"})):
        response = getattr(teacher, method)(f"/api/v1/stacks/{school.stack.slug}/guardians", body, format="json")
        assert response.status_code == 403 and response.json()["error"]["code"] == "admin_required"
    _, read_only = make_key(school.org, read_only=True)
    refused = bearer_client(read_only).post(f"/api/v1/stacks/{school.stack.slug}/guardians",
                                            {"email": "r@example.test"}, format="json")
    assert refused.status_code == 403
    for method, body in (("get", None), ("post", {"email": "o@example.test"})):
        response = getattr(other_school.admin_api, method)(f"/api/v1/stacks/{school.stack.slug}/guardians", body,
                                                           format="json")
        assert response.status_code == 404 and response.json()["error"]["code"] == "stack_not_found"
    assert not Invitation.objects.exists()


def test_bad_input_is_a_400_naming_the_field_and_staff_cannot_be_invited_as_guardians(school: School) -> None:
    url = f"/api/v1/stacks/{school.stack.slug}/guardians"
    bad = school.admin_api.post(url, {"email": "not an address"}, format="json")
    assert bad.status_code == 400 and "email" in bad.json()["error"]["fields"]
    long_name = school.admin_api.post(url, {"email": "x@example.test", "name": "n" * 151}, format="json")
    assert long_name.status_code == 400 and "name" in long_name.json()["error"]["fields"]
    staff = school.admin_api.post(url, {"email": school.teacher.email}, format="json")
    assert staff.status_code == 409 and staff.json()["error"]["code"] == "already_member"
    assert not Invitation.objects.exists()
