"""A person's own account: changing the password (audited, keeps this session, ends the others)
and Django's password-reset flow by email, which cannot be used to flood a mailbox."""

from __future__ import annotations

import re

import pytest
from django.core import mail
from django.test import Client

from accounts.models import AuditEvent, Membership
from tests.actors import FrozenClock, School
from tests.dashboard.pages import client_for, csrf_token
from tests.factories import make_user

pytestmark = pytest.mark.django_db

CHANGE = "/account/password/"
RESET = "/password-reset/"
OLD = "correct horse battery staple"
NEW = "a brand new passphrase 42"
RESET_LINK = re.compile(r"https?://testserver(/password-reset/[^/\s]+/[^/\s]+/)")


def sign_in(username: str, password: str) -> int:
    return Client().post("/login/", {"username": username, "password": password}).status_code


# --- password change ---------------------------------------------------------------------------


def test_changing_the_password_keeps_this_session_ends_the_others_and_is_audited(school: School) -> None:
    here = client_for(school.teacher, csrf=True)
    elsewhere = client_for(school.teacher)
    page = here.get(CHANGE)
    assert page.status_code == 200
    assert "Confirm password" in page.content.decode()

    response = here.post(CHANGE, {"old_password": OLD, "new_password1": NEW, "new_password2": NEW,
                                  "csrfmiddlewaretoken": csrf_token(here, CHANGE)})

    assert response.status_code == 302 and response["Location"] == CHANGE
    assert "Your password was changed" in here.get(CHANGE).content.decode()
    assert here.get("/dashboard/").status_code == 200
    assert elsewhere.get("/dashboard/").status_code == 302  # signed out
    assert sign_in(school.teacher.username, NEW) == 302
    event = AuditEvent.objects.get(action="password.changed")
    assert (event.organization, event.actor, event.metadata) == (school.org, school.teacher, {"via": "change"})


def test_a_wrong_old_password_or_a_weak_new_one_is_a_400_and_changes_nothing(school: School) -> None:
    client = client_for(school.admin)
    wrong = client.post(CHANGE, {"old_password": "nope", "new_password1": NEW, "new_password2": NEW})
    assert wrong.status_code == 400 and "Your old password was entered incorrectly" in wrong.content.decode()
    weak = client.post(CHANGE, {"old_password": OLD, "new_password1": "123", "new_password2": "123"})
    assert weak.status_code == 400 and "too short" in weak.content.decode()
    assert sign_in(school.admin.username, OLD) == 302
    assert not AuditEvent.objects.filter(action="password.changed").exists()


def test_billing_users_may_change_their_password_and_signed_out_visitors_are_sent_to_sign_in(
        school: School) -> None:
    billing = make_user(school.org, role=Membership.Role.BILLING)
    assert client_for(billing).get(CHANGE).status_code == 200
    response = Client().get(CHANGE)
    assert response.status_code == 302 and response["Location"].startswith("/login/")


# --- password reset ------------------------------------------------------------------------------


def test_the_sign_in_page_links_to_the_reset(db: None) -> None:
    page = Client().get("/login/").content.decode()
    assert f'href="{RESET}">Forgot your password?</a>' in page


def test_a_reset_email_is_sent_and_its_link_sets_a_new_password_once(school: School) -> None:
    visitor = Client(enforce_csrf_checks=True)
    signed_in_elsewhere = client_for(school.teacher)
    response = visitor.post(RESET, {"email": school.teacher.email.upper(),
                                    "csrfmiddlewaretoken": csrf_token(visitor, RESET)})

    assert response.status_code == 302 and response["Location"] == "/password-reset/sent/"
    assert "Check your email" in visitor.get(response["Location"]).content.decode()
    assert len(mail.outbox) == 1 and mail.outbox[0].to == [school.teacher.email]
    link = RESET_LINK.search(str(mail.outbox[0].body)).group(1)  # type: ignore[union-attr]

    form_page = visitor.get(link, follow=True)
    assert form_page.status_code == 200 and "Choose a new password" in form_page.content.decode()
    set_url = form_page.redirect_chain[-1][0]
    done = visitor.post(set_url, {"new_password1": NEW, "new_password2": NEW,
                                  "csrfmiddlewaretoken": csrf_token(visitor, set_url)})

    assert done.status_code == 302 and done["Location"] == "/password-reset/done/"
    assert "Your password is set" in visitor.get(done["Location"]).content.decode()
    assert sign_in(school.teacher.username, NEW) == 302
    assert signed_in_elsewhere.get("/dashboard/").status_code == 302  # old sessions ended
    assert AuditEvent.objects.filter(action="password.changed", actor=school.teacher,
                                     metadata={"via": "reset"}).exists()
    # The link works once.
    reused = Client().get(link, follow=True)
    assert "This link cannot be used" in reused.content.decode()


def test_a_mismatched_new_password_is_a_400(school: School) -> None:
    visitor = Client()
    visitor.post(RESET, {"email": school.admin.email})
    link = RESET_LINK.search(str(mail.outbox[0].body)).group(1)  # type: ignore[union-attr]
    set_url = visitor.get(link, follow=True).redirect_chain[-1][0]
    response = visitor.post(set_url, {"new_password1": NEW, "new_password2": NEW + "x"})
    assert response.status_code == 400 and "The two password fields didn" in response.content.decode()
    assert sign_in(school.admin.username, OLD) == 302


def test_an_unknown_email_gets_the_same_answer_and_no_mail(db: None) -> None:
    response = Client().post(RESET, {"email": "nobody@example.test"})
    assert response.status_code == 302 and response["Location"] == "/password-reset/sent/"
    assert mail.outbox == []
    invalid = Client().post(RESET, {"email": "not an email"})
    assert invalid.status_code == 400 and "valid email" in invalid.content.decode()


def test_reset_requests_are_limited_per_email_and_per_ip(school: School, throttle_clock: FrozenClock) -> None:
    for _ in range(3):
        assert Client().post(RESET, {"email": school.admin.email}).status_code == 302
    limited = Client().post(RESET, {"email": school.admin.email.upper()})
    assert limited.status_code == 429 and int(limited["Retry-After"]) > 0
    assert "Too many password reset requests" in limited.content.decode()
    assert len(mail.outbox) == 3

    # Other addresses from the same client IP: ten requests an hour in all, then a wait.
    for n in range(7):
        assert Client().post(RESET, {"email": f"someone{n}@example.test"}).status_code == 302
    assert Client().post(RESET, {"email": "one-more@example.test"}).status_code == 429

    throttle_clock.advance(2 * 3600 + 1)  # the blocks (an hour) and the window are over
    assert Client().post(RESET, {"email": school.admin.email}).status_code == 302
    assert len(mail.outbox) == 4
