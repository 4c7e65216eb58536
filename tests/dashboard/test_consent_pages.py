"""Consent and pause on the dashboard (docs/consent.md): the student page's panel and its admin
buttons, the guardian's controls on their child's page, and who may press which."""

from __future__ import annotations

import pytest

from accounts.models import AuditEvent, Membership, Organization, User
from memories.models import Memory
from stacks.models import GuardianLink, Stack, StackConsent
from tests.actors import School
from tests.dashboard.pages import client_for, csrf_token
from tests.factories import make_user

pytestmark = pytest.mark.django_db


def guardian_of(school: School, stack: Stack) -> User:
    guardian = make_user(school.org, role=Membership.Role.GUARDIAN, first_name="Gwen", last_name="Parent")
    GuardianLink.objects.create(user=guardian, stack=stack)
    return guardian


def require_consent(school: School, **settings: object) -> None:
    org = Organization.objects.get(pk=school.org.pk)
    org.consent_required = True
    for name, value in settings.items():
        setattr(org, name, value)
    org.save()


def test_admin_records_paper_consent_and_pauses_from_the_student_page(school: School) -> None:
    require_consent(school)
    student = f"/dashboard/students/{school.stack.slug}/"
    admin = client_for(school.admin, csrf=True)
    page = admin.get(student).content.decode()
    assert "Awaiting consent" in page and "Record paper consent" in page
    token = csrf_token(admin, student)
    recorded = admin.post(f"{student}consent", {"action": "given", "note": "office, folder 3",
                                                "csrfmiddlewaretoken": token})
    assert recorded.status_code == 302 and recorded["Location"] == student
    stack = Stack.objects.get(pk=school.stack.pk)
    assert stack.consent_given_at is not None
    page = admin.get(student).content.decode()
    assert "in force" in page and "Awaiting consent" not in page and "office, folder 3" in page

    paused = admin.post(f"{student}pause", {"action": "pause", "csrfmiddlewaretoken": token})
    assert paused.status_code == 302
    page = admin.get(student).content.decode()
    assert "Memory paused by" in page and "Resume memory" in page
    refused = school.agent.post(school.stack_url("memories"), {"kind": "note", "content": "x"}, format="json")
    assert refused.json()["error"]["code"] == "memory_paused"
    admin.post(f"{student}pause", {"action": "resume", "csrfmiddlewaretoken": token})
    assert Stack.objects.get(pk=school.stack.pk).paused_at is None
    assert set(AuditEvent.objects.filter(organization=school.org).values_list("action", flat=True)) >= {
        "consent.given", "stack.memory_paused", "stack.memory_resumed"}


def test_teachers_see_the_state_but_get_no_buttons_and_cannot_post(school: School) -> None:
    require_consent(school)
    teacher = client_for(school.teacher)
    page = teacher.get(f"/dashboard/students/{school.stack.slug}/").content.decode()
    assert "Consent and pause" in page and "Record paper consent" not in page
    assert teacher.post(f"/dashboard/students/{school.stack.slug}/consent", {"action": "given"}).status_code == 404
    assert teacher.post(f"/dashboard/students/{school.stack.slug}/pause", {"action": "pause"}).status_code == 404
    assert not StackConsent.objects.exists() and Stack.objects.get(pk=school.stack.pk).paused_at is None


def test_a_guardian_gives_consent_pauses_and_withdraws_on_their_childs_page(school: School) -> None:
    require_consent(school, consent_text="We keep notes on how Alice learns.")
    guardian = client_for(guardian_of(school, school.stack), csrf=True)
    child = f"/dashboard/family/{school.stack.slug}/"
    page = guardian.get(child).content.decode()
    assert "We keep notes on how Alice learns." in page and "give consent" in page
    token = csrf_token(guardian, child)
    base = f"/dashboard/families/{school.stack.slug}/"
    given = guardian.post(f"{base}consent", {"action": "given", "csrfmiddlewaretoken": token})
    assert given.status_code == 302 and given["Location"] == child
    row = StackConsent.objects.get(stack=school.stack)
    assert (row.method, row.text, len(row.session_ref)) == ("online", "We keep notes on how Alice learns.", 64)
    created = school.agent.post(school.stack_url("memories"), {"kind": "note", "content": "ok"}, format="json")
    assert created.status_code == 201

    assert guardian.post(f"{base}pause", {"action": "pause", "csrfmiddlewaretoken": token}).status_code == 302
    assert "paused by guardian Gwen Parent" in guardian.get(child).content.decode()
    assert "Memory paused by guardian Gwen Parent" in client_for(school.admin).get(
        f"/dashboard/students/{school.stack.slug}/").content.decode()
    guardian.post(f"{base}pause", {"action": "resume", "csrfmiddlewaretoken": token})
    withdrawn = guardian.post(f"{base}consent", {"action": "withdrawn", "csrfmiddlewaretoken": token})
    assert withdrawn.status_code == 302
    assert Stack.objects.get(pk=school.stack.pk).consent_given_at is None
    assert Memory.objects.filter(stack=school.stack).count() == 1  # the school keeps the data ("keep")


def test_a_guardian_reaches_only_their_child_and_pauses_only_if_the_school_allows(school: School) -> None:
    require_consent(school, guardians_may_pause=False)
    guardian = client_for(guardian_of(school, school.stack))
    other = f"/dashboard/families/{school.other_stack.slug}/"
    assert guardian.post(f"{other}consent", {"action": "given"}).status_code == 404
    assert guardian.post(f"{other}pause", {"action": "pause"}).status_code == 404
    assert "Pause memory" not in guardian.get(f"/dashboard/family/{school.stack.slug}/").content.decode()
    refused = guardian.post(f"/dashboard/families/{school.stack.slug}/pause", {"action": "pause"})
    assert refused.status_code == 403
    assert Stack.objects.get(pk=school.stack.pk).paused_at is None
    # Staff pages' controls are not a guardian's, nor the guardian's a member of staff's.
    assert guardian.post(f"/dashboard/students/{school.stack.slug}/consent", {"action": "given"}).status_code == 404
    assert client_for(school.admin).post(f"/dashboard/families/{school.stack.slug}/consent",
                                         {"action": "given"}).status_code == 404
    assert not StackConsent.objects.exists()


def test_the_privacy_page_changes_the_consent_settings(school: School) -> None:
    admin = client_for(school.admin)
    page = admin.get("/dashboard/privacy/").content.decode()
    assert "Require a guardian&#x27;s consent before agents write" in page or (
        "Require a guardian's consent before agents write" in page)
    saved = admin.post("/dashboard/privacy/", {
        "redaction_categories": ["EMAIL", "PHONE", "IP_ADDRESS"], "empty_grants_policy": "school",
        "consent_settings": "on", "consent_required": "on", "consent_text": "We agree to the tutor's notes.",
        "consent_withdrawal": "erase"})
    assert saved.status_code == 302, saved.content.decode()[:2000]
    org = Organization.objects.get(pk=school.org.pk)
    assert (org.consent_required, org.consent_text, org.consent_withdrawal, org.guardians_may_pause) == (
        True, "We agree to the tutor's notes.", "erase", False)
    assert AuditEvent.objects.filter(organization=school.org, action="privacy.updated").exists()


def test_the_overview_names_paused_students_and_those_awaiting_consent(school: School) -> None:
    Stack.objects.filter(pk=school.stack.pk).update(paused_at=school.org.created_at, display_name="Alice Paused")
    page = client_for(school.admin).get("/dashboard/").content.decode()
    assert 'data-attention="paused"' in page and "Alice Paused" in page
    assert 'data-attention="consent"' not in page  # the school does not require consent
    require_consent(school)
    Stack.objects.filter(pk=school.other_stack.pk).update(display_name="Bob Waiting")
    page = client_for(school.admin).get("/dashboard/").content.decode()
    assert 'data-attention="consent"' in page and "Bob Waiting" in page
    # The teacher sees only the student assigned to them (Alice).
    page = client_for(school.teacher).get("/dashboard/").content.decode()
    assert "Alice Paused" in page and "Bob Waiting" not in page
