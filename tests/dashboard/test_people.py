"""The People page: a school admin invites people by email (the link is emailed and shown once,
only its hash is stored), the invitee joins by setting a password, and admins change roles and
remove members — whose sessions and keys die with it. Nobody else reaches any of it."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.core import mail
from django.test import Client
from django.utils import timezone

from accounts.invitations import token_hash
from accounts.models import ApiKey, AuditEvent, Invitation, Membership, User
from tests.actors import School
from tests.dashboard.pages import client_for, csrf_token
from tests.factories import bearer_client, make_key, make_user

pytestmark = pytest.mark.django_db

URL = "/dashboard/people/"
LINK = re.compile(r"https?://[^/\s]+/invitations/([A-Za-z0-9_-]+)/")


def invite(client: Client, email: str, role: str = "teacher") -> str:
    """Invite through the page; returns the link's token as shown to the admin."""
    response = client.post(URL, {"email": email, "role": role})
    assert response.status_code == 201, response.content.decode()
    match = LINK.search(response.content.decode())
    assert match
    return match.group(1)


def audit_actions(school: School) -> list[str]:
    return list(AuditEvent.objects.filter(organization=school.org).values_list("action", flat=True))


# --- who reaches the page ----------------------------------------------------------------------


def test_the_admin_sees_members_with_role_and_joined_date_and_open_invitations(school: School) -> None:
    Invitation.objects.create(organization=school.org, email="pending@example.test", role="billing",
                              token_hash="0" * 64, expires_at=timezone.now() + timedelta(days=3))
    response = client_for(school.admin).get(URL)
    assert response.status_code == 200
    page = response.content.decode()
    assert school.admin.email in page and school.teacher.email in page
    assert f'data-member="{school.teacher.public_id}"' in page
    assert 'value="teacher" selected' in page  # the teacher's current role is the selected one
    assert "pending@example.test" in page and "Billing" in page
    joined = Membership.objects.get(user=school.teacher).created_at
    assert f"{joined.day} {joined:%b %Y}" in page


@pytest.mark.parametrize("who", ["teacher", "billing"])
def test_teachers_and_billing_users_get_404_on_every_people_route(school: School, who: str) -> None:
    user = school.teacher if who == "teacher" else make_user(school.org, role=Membership.Role.BILLING)
    invitation = Invitation.objects.create(organization=school.org, email="x@example.test", role="teacher",
                                           token_hash="1" * 64, expires_at=timezone.now() + timedelta(days=3))
    client = client_for(user)
    assert client.get(URL).status_code == 404
    assert client.post(URL, {"email": "new@example.test", "role": "admin"}).status_code == 404
    assert client.post(f"/dashboard/people/{school.admin.public_id}/role", {"role": "teacher"}).status_code == 404
    assert client.post(f"/dashboard/people/{school.admin.public_id}/remove").status_code == 404
    assert client.post(f"/dashboard/invitations/{invitation.public_id}/revoke").status_code == 404
    assert not Invitation.objects.filter(email="new@example.test").exists()
    assert Membership.objects.get(user=school.admin).role == "admin"


def test_signed_out_visitors_are_sent_to_sign_in(school: School) -> None:
    response = Client().get(URL)
    assert response.status_code == 302 and response["Location"].startswith("/login/")


# --- inviting and joining ------------------------------------------------------------------------


def test_an_invitation_is_emailed_shown_once_and_lets_the_invitee_join_and_sign_in(school: School) -> None:
    admin = client_for(school.admin, csrf=True)
    token = csrf_token(admin, URL)
    response = admin.post(URL, {"email": "New.Teacher@Example.test", "role": "teacher",
                                "csrfmiddlewaretoken": token})

    assert response.status_code == 201
    assert "no-store" in response["Cache-Control"]
    page = response.content.decode()
    link_token = LINK.search(page).group(1)  # type: ignore[union-attr]
    assert 'data-copy="#invitation-link"' in page
    # Emailed to the invitee with the same link; the database keeps only its hash.
    assert len(mail.outbox) == 1 and mail.outbox[0].to == ["New.Teacher@Example.test"]
    assert f"/invitations/{link_token}/" in mail.outbox[0].body
    invitation = Invitation.objects.get(organization=school.org)
    assert invitation.token_hash == token_hash(link_token) and link_token not in str(vars(invitation))
    assert (invitation.role, invitation.invited_by) == ("teacher", school.admin)
    assert invitation.expires_at - timezone.now() > timedelta(days=6, hours=23)
    assert "invitation.created" in audit_actions(school)
    # Shown once: the next visit to the page lists the invitation without its link.
    again = admin.get(URL).content.decode()
    assert "new.teacher@example.test" in again.lower() and link_token not in again

    invitee = Client(enforce_csrf_checks=True)
    form = invitee.get(f"/invitations/{link_token}/")
    assert form.status_code == 200
    text = form.content.decode()
    assert "New password" in text and "Confirm password" in text and "Join school" in text
    joined = invitee.post(f"/invitations/{link_token}/", {
        "password1": "a long and new passphrase", "password2": "a long and new passphrase",
        "csrfmiddlewaretoken": csrf_token(invitee, f"/invitations/{link_token}/")})

    assert joined.status_code == 302 and joined["Location"] == "/dashboard/"
    user = User.objects.get(email__iexact="new.teacher@example.test")
    assert user.check_password("a long and new passphrase")
    assert Membership.objects.get(user=user, organization=school.org).role == "teacher"
    assert invitee.get("/dashboard/").status_code == 200  # signed in, in the school
    invitation.refresh_from_db()
    assert invitation.accepted_by == user
    assert {"invitation.accepted", "member.added"} <= set(audit_actions(school))


def test_an_accepted_invitation_cannot_be_used_again(school: School) -> None:
    token = invite(client_for(school.admin), "once@example.test")
    passwords = {"password1": "a long and new passphrase", "password2": "a long and new passphrase"}
    assert Client().post(f"/invitations/{token}/", passwords).status_code == 302

    again = Client()
    assert again.get(f"/invitations/{token}/").status_code == 410
    reused = again.post(f"/invitations/{token}/", {**passwords, "password1": "another passphrase here",
                                                   "password2": "another passphrase here"})
    assert reused.status_code == 410
    assert "already been used" in reused.content.decode()
    assert User.objects.get(email="once@example.test").check_password("a long and new passphrase")


def test_an_expired_invitation_is_refused_and_creates_nothing(school: School) -> None:
    token = invite(client_for(school.admin), "late@example.test")
    Invitation.objects.filter(email="late@example.test").update(expires_at=timezone.now() - timedelta(minutes=1))

    page = Client().get(f"/invitations/{token}/")
    assert page.status_code == 410 and "expired" in page.content.decode()
    posted = Client().post(f"/invitations/{token}/", {"password1": "a long and new passphrase",
                                                      "password2": "a long and new passphrase"})
    assert posted.status_code == 410
    assert not User.objects.filter(email="late@example.test").exists()
    # The admin may invite the same person again: the expired invitation no longer holds the slot.
    assert invite(client_for(school.admin), "late@example.test") != token


def test_an_unknown_link_is_a_404(db: None) -> None:
    assert Client().get("/invitations/not-a-real-token/").status_code == 404
    assert Client().get("/invitations/" + "x" * 300 + "/").status_code == 404


def test_weak_or_mismatched_passwords_are_a_400_with_errors_and_store_nothing(school: School) -> None:
    token = invite(client_for(school.admin), "weak@example.test")
    weak = Client().post(f"/invitations/{token}/", {"password1": "12345", "password2": "12345"})
    assert weak.status_code == 400
    assert "too short" in weak.content.decode()
    mismatched = Client().post(f"/invitations/{token}/", {"password1": "a long and new passphrase",
                                                          "password2": "a different passphrase"})
    assert mismatched.status_code == 400
    assert "The two password fields didn" in mismatched.content.decode()
    assert not User.objects.filter(email="weak@example.test").exists()
    assert Invitation.objects.get(email="weak@example.test").accepted_at is None


def test_bad_invitations_are_refused_with_the_reason_and_store_nothing(school: School) -> None:
    admin = client_for(school.admin)
    bad_email = admin.post(URL, {"email": "not an email", "role": "teacher"})
    assert bad_email.status_code == 400 and "valid email" in bad_email.content.decode()
    bad_role = admin.post(URL, {"email": "ok@example.test", "role": "owner"})
    assert bad_role.status_code == 400 and "Select a valid choice" in bad_role.content.decode()
    member = admin.post(URL, {"email": school.teacher.email.upper(), "role": "admin"})
    assert member.status_code == 409 and "Already a member" in member.content.decode()
    assert not Invitation.objects.exists()

    invite(admin, "twice@example.test")
    second = admin.post(URL, {"email": "TWICE@example.test", "role": "admin"})
    assert second.status_code == 409 and "Already invited" in second.content.decode()
    assert Invitation.objects.filter(email__iexact="twice@example.test").count() == 1
    assert len(mail.outbox) == 1


def test_a_revoked_invitation_stops_working_and_other_schools_invitations_are_404(
        school: School, other_school: School) -> None:
    admin = client_for(school.admin)
    token = invite(admin, "revoked@example.test")
    invitation = Invitation.objects.get(email="revoked@example.test")
    theirs_token = invite(client_for(other_school.admin), "theirs@example.test")
    theirs = Invitation.objects.get(email="theirs@example.test")

    assert admin.post(f"/dashboard/invitations/{theirs.public_id}/revoke").status_code == 404
    response = admin.post(f"/dashboard/invitations/{invitation.public_id}/revoke")
    assert response.status_code == 302
    assert Client().get(f"/invitations/{token}/").status_code == 410
    assert "invitation.revoked" in audit_actions(school)
    assert Client().get(f"/invitations/{theirs_token}/").status_code == 200  # untouched
    assert "theirs@example.test" not in admin.get(URL).content.decode()


def test_an_existing_account_joins_only_when_signed_in_as_the_invited_email(
        school: School, other_school: School) -> None:
    person = other_school.teacher  # has an account (in another school)
    token = invite(client_for(school.admin), person.email, role="billing")

    signed_out = Client().get(f"/invitations/{token}/").content.decode()
    assert "already exists" in signed_out and "Sign in" in signed_out
    refused = Client().post(f"/invitations/{token}/", {"password1": "x", "password2": "x"})
    assert refused.status_code == 409
    wrong_person = client_for(school.teacher).post(f"/invitations/{token}/")
    assert wrong_person.status_code == 403
    assert not Membership.objects.filter(user=person, organization=school.org).exists()

    joined = client_for(person).post(f"/invitations/{token}/")
    assert joined.status_code == 302
    assert Membership.objects.get(user=person, organization=school.org).role == "billing"
    person.refresh_from_db()
    assert person.check_password("correct horse battery staple")  # their password is untouched


# --- roles and removal -------------------------------------------------------------------------


def test_changing_a_role_is_audited_and_a_lowered_admin_loses_their_school_keys(school: School) -> None:
    second_admin = make_user(school.org, role=Membership.Role.ADMIN)
    _, secret = make_key(school.org, user=second_admin)
    admin = client_for(school.admin, csrf=True)

    response = admin.post(f"/dashboard/people/{second_admin.public_id}/role",
                          {"role": "teacher", "csrfmiddlewaretoken": csrf_token(admin, URL)})

    assert response.status_code == 302
    assert Membership.objects.get(user=second_admin).role == "teacher"
    assert "member.role_changed" in audit_actions(school)
    assert bearer_client(secret).get("/api/v1/stacks/").status_code == 401
    assert "is now teacher" in admin.get(URL).content.decode()


def test_the_last_admin_cannot_lower_their_own_role(school: School) -> None:
    response = client_for(school.admin).post(f"/dashboard/people/{school.admin.public_id}/role", {"role": "teacher"})
    assert response.status_code == 409
    assert "at least one admin" in response.content.decode()
    assert Membership.objects.get(user=school.admin).role == "admin"


def test_unknown_roles_and_other_schools_members_are_refused(school: School, other_school: School) -> None:
    admin = client_for(school.admin)
    assert admin.post(f"/dashboard/people/{school.teacher.public_id}/role", {"role": "owner"}).status_code == 400
    assert admin.post(f"/dashboard/people/{other_school.teacher.public_id}/role",
                      {"role": "admin"}).status_code == 404
    assert admin.post(f"/dashboard/people/{other_school.teacher.public_id}/remove").status_code == 404
    assert Membership.objects.get(user=school.teacher).role == "teacher"
    assert Membership.objects.filter(user=other_school.teacher).exists()


def test_a_removed_member_is_signed_out_everywhere_and_their_keys_get_401(school: School) -> None:
    # The teacher is signed in on their own device and has a key for their stack.
    school.org.teachers_may_manage_keys = True
    school.org.save(update_fields=["teachers_may_manage_keys"])
    key, secret = make_key(school.org, stack=school.stack, user=school.teacher)
    teacher = client_for(school.teacher)
    assert teacher.get("/dashboard/").status_code == 200
    assert bearer_client(secret).get(f"/api/v1/stacks/{school.stack.slug}/").status_code == 200

    response = client_for(school.admin).post(f"/dashboard/people/{school.teacher.public_id}/remove")

    assert response.status_code == 302
    assert not Membership.objects.filter(user=school.teacher).exists()
    after = teacher.get("/dashboard/")
    assert after.status_code == 302 and after["Location"].startswith("/login/")  # the session is gone
    assert bearer_client(secret).get(f"/api/v1/stacks/{school.stack.slug}/").status_code == 401
    assert ApiKey.objects.get(pk=key.pk).revoked_at is not None
    assert "member.removed" in audit_actions(school)


def test_the_last_admin_cannot_be_removed(school: School) -> None:
    response = client_for(school.admin).post(f"/dashboard/people/{school.admin.public_id}/remove")
    assert response.status_code == 409
    assert Membership.objects.filter(user=school.admin).exists()


def test_a_post_without_the_csrf_token_is_refused(school: School) -> None:
    response = client_for(school.admin, csrf=True).post(URL, {"email": "x@example.test", "role": "teacher"})
    assert response.status_code == 403
    assert not Invitation.objects.exists()


def test_an_admin_who_lowers_their_own_role_lands_on_the_overview(school: School) -> None:
    make_user(school.org, role=Membership.Role.ADMIN)  # another admin remains
    client = client_for(school.admin)
    response = client.post(f"/dashboard/people/{school.admin.public_id}/role", {"role": "teacher"})
    assert response.status_code == 302 and response["Location"] == "/dashboard/"
    assert client.get(URL).status_code == 404  # the page is for admins only
