"""Guardians' requests through the dashboard (docs/guardians.md "Requests"): a guardian asks for a
correction or a deletion on their child's page; the school's admins are e-mailed, see it in the
Requests queue (and under "needs attention" when it is due soon), approve it — the correction as a
revision naming the request, the deletion by the erasure service with its certificate sent to the
guardian — or decline it with a reason the guardian reads. Every step is audited and e-mails the
guardian; no e-mail carries memory text. Bad input is a 4xx; another school is a 404."""

from __future__ import annotations

import html
from datetime import timedelta
from typing import Any

import pytest
from django.core import mail
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import AuditEvent, Membership
from memories.governance.consent import DEFAULT_CONSENT_TEXT
from memories.models import ErasureCertificate, Memory, MemoryRevision
from memories.services import memory_create
from stacks.models import GuardianLink, GuardianRequest
from tests.factories import make_org, make_stack, make_user

pytestmark = pytest.mark.django_db

SECRET_TEXT = "Mia finds long division very hard"
CORRECTED = "Mia now does long division with confidence"


def _cast() -> dict[str, Any]:
    org = make_org("Riverside Primary")
    admin = make_user(org, role=Membership.Role.ADMIN, email="head@riverside.example")
    child = make_stack(org, "mia-jones", display_name="Mia Jones")
    other = make_stack(org, "noah-king", display_name="Noah King")
    memory = memory_create(stack=child, kind="note", payload={"content": SECRET_TEXT}, source="test")
    other_memory = memory_create(stack=other, kind="note", payload={"content": "about Noah"}, source="test")
    guardian = make_user(org, role=Membership.Role.GUARDIAN, email="parent@riverside.example")
    GuardianLink.objects.create(user=guardian, stack=child)
    family, staff = Client(), Client()
    family.force_login(guardian)
    staff.force_login(admin)
    return {"org": org, "admin": admin, "child": child, "other": other, "memory": memory,
            "other_memory": other_memory, "guardian": guardian, "family": family, "staff": staff}


def _ask(cast: dict[str, Any], memory: Memory, **data: str) -> Any:
    return cast["family"].post(f"/dashboard/family/{cast['child'].slug}/memories/{memory.pk}/request", data)


def _no_memory_text_in_mail() -> None:
    for message in mail.outbox:
        assert SECRET_TEXT not in message.body and CORRECTED not in message.body, message.subject
        assert "long division" not in message.subject


def test_a_correction_is_asked_queued_approved_as_a_revision_naming_the_request(
        django_capture_on_commit_callbacks: Any) -> None:
    cast = _cast()
    cast["org"].guardian_request_days = 7
    cast["org"].save(update_fields=["guardian_request_days"])
    page = cast["family"].get(f"/dashboard/family/{cast['child'].slug}/memories/{cast['memory'].pk}/request")
    assert page.status_code == 200 and SECRET_TEXT in page.content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        response = _ask(cast, cast["memory"], kind="correction", text=CORRECTED)
    assert response.status_code == 302
    row = GuardianRequest.objects.get()
    assert row.status == "open" and row.kind == "correction" and row.memory_ref == cast["memory"].pk
    assert abs((row.due_at - timezone.now()) - timedelta(days=7)) < timedelta(minutes=1)
    assert {tuple(m.to) for m in mail.outbox} == {("head@riverside.example",), ("parent@riverside.example",)}
    assert AuditEvent.objects.filter(action="guardian_request.created", target_id=str(row.pk)).exists()

    # The guardian sees it open with its due date; the admin's queue lists it and the detail shows both texts.
    child_page = cast["family"].get(f"/dashboard/family/{cast['child'].slug}/").content.decode()
    assert f"#{row.pk}" in child_page and "the school answers by" in child_page
    assert cast["staff"].get("/dashboard/").content.decode().count('data-attention="guardian-request"') == 0
    queue = cast["staff"].get("/dashboard/requests/").content.decode()
    assert f'data-request="{row.pk}"' in queue and "Mia Jones" in queue and 'href="/dashboard/requests/"' in queue
    detail = cast["staff"].get(f"/dashboard/requests/{row.pk}/").content.decode()
    assert SECRET_TEXT in detail and CORRECTED in detail

    mail.outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        decided = cast["staff"].post(f"/dashboard/requests/{row.pk}/", {"action": "approve"})
    assert decided.status_code == 302
    memory = Memory.objects.get(pk=cast["memory"].pk)
    assert memory.text == CORRECTED
    revision = MemoryRevision.objects.get(memory=memory)
    assert revision.author["agent"] == f"guardian request #{row.pk}"
    assert revision.reason == f"correction asked for in guardian request #{row.pk}"
    assert revision.author["user"] == "head@riverside.example"
    row.refresh_from_db()
    assert row.status == "approved" and row.text == "" and row.decided_by == cast["admin"]
    assert [m.to for m in mail.outbox] == [["parent@riverside.example"]] and "approved" in mail.outbox[0].subject
    assert AuditEvent.objects.filter(action="guardian_request.approved", target_id=str(row.pk)).exists()
    _no_memory_text_in_mail()
    # Decided once: a second decision is a 409, not a second write.
    again = cast["staff"].post(f"/dashboard/requests/{row.pk}/", {"action": "approve"})
    assert again.status_code == 409 and MemoryRevision.objects.filter(memory=memory).count() == 1


def test_a_deletion_is_erased_with_a_certificate_the_guardian_reads(django_capture_on_commit_callbacks: Any) -> None:
    cast = _cast()
    with django_capture_on_commit_callbacks(execute=True):
        assert _ask(cast, cast["memory"], kind="deletion").status_code == 302
    row = GuardianRequest.objects.get()
    assert row.scope == "memory"
    mail.outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        assert cast["staff"].post(f"/dashboard/requests/{row.pk}/", {"action": "approve"}).status_code == 302
    row.refresh_from_db()
    assert row.certificate_ref is not None
    cert = ErasureCertificate.objects.get(pk=row.certificate_ref)
    assert cert.status == "done" and cert.memory_ref == cast["memory"].pk
    assert f"guardian request #{row.pk}" in cert.requested_by
    assert not Memory.objects.filter(pk=cast["memory"].pk).exists()
    link = f"/dashboard/family/{cast['child'].slug}/requests/{row.pk}/certificate"
    assert link in mail.outbox[0].body
    _no_memory_text_in_mail()
    assert link in cast["family"].get(f"/dashboard/family/{cast['child'].slug}/").content.decode()
    certificate_page = cast["family"].get(link)
    assert certificate_page.status_code == 200 and str(cert.pk) in certificate_page.content.decode()
    # Another guardian of the school (another family) cannot open it.
    stranger = make_user(cast["org"], role=Membership.Role.GUARDIAN)
    GuardianLink.objects.create(user=stranger, stack=cast["other"])
    other_family = Client()
    other_family.force_login(stranger)
    assert other_family.get(link).status_code == 404


def test_the_whole_stack_deletion_runs_the_stack_erasure(django_capture_on_commit_callbacks: Any) -> None:
    cast = _cast()
    url = f"/dashboard/families/{cast['child'].slug}/requests"
    assert cast["family"].post(url, {}).status_code == 400  # the box confirming it is not ticked
    with django_capture_on_commit_callbacks(execute=True):
        assert cast["family"].post(url, {"confirm": "all"}).status_code == 302
    assert cast["family"].post(url, {"confirm": "all"}).status_code == 409  # already open
    row = GuardianRequest.objects.get()
    assert row.scope == "stack" and row.kind == "deletion"
    with django_capture_on_commit_callbacks(execute=True):
        assert cast["staff"].post(f"/dashboard/requests/{row.pk}/", {"action": "approve"}).status_code == 302
    row.refresh_from_db()
    assert row.certificate_ref is not None
    cert = ErasureCertificate.objects.get(pk=row.certificate_ref)
    assert cert.scope == "stack" and cert.status == "done"
    assert not Memory.objects.filter(stack=cast["child"]).exists()
    assert Memory.objects.filter(stack=cast["other"]).exists()


def test_a_declined_request_shows_its_reason_and_bad_input_is_a_4xx(django_capture_on_commit_callbacks: Any) -> None:
    cast = _cast()
    # Bad input: no text, an unknown kind, a memory id that is not one, another family's memory.
    assert _ask(cast, cast["memory"], kind="correction", text="  ").status_code == 400
    assert _ask(cast, cast["memory"], kind="nonsense").status_code == 400
    base = f"/dashboard/family/{cast['child'].slug}/memories"
    assert cast["family"].post(f"{base}/not-a-uuid/request", {"kind": "deletion"}).status_code == 404
    assert cast["family"].post(f"{base}/{cast['other_memory'].pk}/request", {"kind": "deletion"}).status_code == 404
    assert not GuardianRequest.objects.exists()
    with django_capture_on_commit_callbacks(execute=True):
        _ask(cast, cast["memory"], kind="correction", text=CORRECTED)
    row = GuardianRequest.objects.get()
    detail = f"/dashboard/requests/{row.pk}/"
    assert cast["staff"].post(detail, {"action": "decline", "reason": ""}).status_code == 400
    assert cast["staff"].post(detail, {"action": "shrug"}).status_code == 400
    assert cast["staff"].get("/dashboard/requests/not-a-number/").status_code == 404
    mail.outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        response = cast["staff"].post(detail, {"action": "decline", "reason": "The tutor's note is accurate."})
    assert response.status_code == 302
    row.refresh_from_db()
    assert row.status == "declined" and row.text == ""
    assert Memory.objects.get(pk=cast["memory"].pk).text == SECRET_TEXT
    assert "declined" in mail.outbox[0].subject and "accurate" not in mail.outbox[0].body
    child_page = cast["family"].get(f"/dashboard/family/{cast['child'].slug}/").content.decode()
    assert "The tutor&#x27;s note is accurate." in child_page
    assert AuditEvent.objects.filter(action="guardian_request.declined", target_id=str(row.pk)).exists()


def test_a_request_due_soon_needs_attention() -> None:
    cast = _cast()
    row = GuardianRequest.objects.create(organization=cast["org"], stack=cast["child"], kind="deletion",
                                         scope="stack", requested_by=cast["guardian"],
                                         due_at=timezone.now() + timedelta(days=1))
    overview = cast["staff"].get("/dashboard/").content.decode()
    assert 'data-attention="guardian-request"' in overview and f"/dashboard/requests/{row.pk}/" in overview
    GuardianRequest.objects.filter(pk=row.pk).update(due_at=timezone.now() + timedelta(days=5))
    assert 'data-attention="guardian-request"' not in cast["staff"].get("/dashboard/").content.decode()


def test_staff_of_another_school_and_teachers_cannot_see_or_decide_a_request() -> None:
    cast = _cast()
    row = GuardianRequest.objects.create(organization=cast["org"], stack=cast["child"], kind="deletion",
                                         scope="memory", memory_ref=cast["memory"].pk, requested_by=cast["guardian"],
                                         due_at=timezone.now() + timedelta(days=10))
    elsewhere = make_org("Hillside")
    outsiders = [make_user(elsewhere, role=Membership.Role.ADMIN), make_user(cast["org"], role=Membership.Role.TEACHER),
                 cast["guardian"]]
    for outsider in outsiders:
        client = Client()
        client.force_login(outsider)
        assert client.get(f"/dashboard/requests/{row.pk}/").status_code == 404
        assert client.post(f"/dashboard/requests/{row.pk}/", {"action": "approve"}).status_code == 404
        queue = client.get("/dashboard/requests/")
        assert queue.status_code == 404 or f'data-request="{row.pk}"' not in queue.content.decode()
    row.refresh_from_db()
    assert row.status == "open" and Memory.objects.filter(pk=cast["memory"].pk).exists()


def test_the_due_days_are_a_privacy_setting_and_the_policy_names_consent_when_required() -> None:
    cast = _cast()
    api = APIClient()  # the access rule is under test here; CSRF is the session layer's (tested elsewhere)
    api.force_login(cast["admin"])
    assert api.get("/api/v1/privacy").json()["guardian_request_days"] == 10
    for bad in (0, 91, "ten", True):
        response = api.put("/api/v1/privacy", {"guardian_request_days": bad}, format="json")
        assert response.status_code == 400, bad
    response = api.put("/api/v1/privacy", {"guardian_request_days": 5, "consent_required": True}, format="json")
    assert response.status_code == 200 and response.json()["guardian_request_days"] == 5
    titles = [section["title"] for section in response.json()["policy"]]
    assert "Parents' consent" in titles
    page = cast["staff"].get("/dashboard/privacy/").content.decode()
    assert 'name="guardian_request_days"' in page and 'value="5"' in page
    assert f'placeholder="{html.escape(DEFAULT_CONSENT_TEXT[:40])}' in page  # the default consent text
    form = cast["staff"].post("/dashboard/privacy/", {"consent_settings": "on", "guardian_request_days": "0",
                                                      "empty_grants_policy": "school"})
    assert form.status_code == 400


def test_the_children_list_counts_each_childs_memories() -> None:
    cast = _cast()
    page = cast["family"].get("/dashboard/family/").content.decode()
    assert "1 memory" in page and "no tutor has" not in page


def test_erasing_the_student_clears_the_corrections_proposed_for_them(django_capture_on_commit_callbacks: Any) -> None:
    cast = _cast()
    with django_capture_on_commit_callbacks(execute=True):
        _ask(cast, cast["memory"], kind="correction", text=CORRECTED)
    response = cast["staff"].post(f"/dashboard/students/{cast['child'].slug}/erase",
                                  {"confirm": cast["child"].slug, "requested_by": "the school"})
    assert response.status_code == 302
    row = GuardianRequest.objects.get()
    assert row.text == "" and row.status == "open"  # the record stays; the proposed text is gone
    cert = ErasureCertificate.objects.get(stack_ref=cast["child"].pk)
    assert cert.counts.get("guardian_request_texts") == 1


def test_erasing_one_memory_clears_the_correction_proposed_for_it_only(
        django_capture_on_commit_callbacks: Any) -> None:
    cast = _cast()
    other = memory_create(stack=cast["child"], kind="note", payload={"content": "another note"}, source="test")
    with django_capture_on_commit_callbacks(execute=True):
        _ask(cast, cast["memory"], kind="correction", text=CORRECTED)
        _ask(cast, other, kind="correction", text="keep this proposal")
    response = cast["staff"].post(f"/dashboard/students/{cast['child'].slug}/memories/{cast['memory'].pk}/erase",
                                  {"confirm": "erase", "requested_by": "the school"})
    assert response.status_code == 302, response.content.decode()[:500]
    texts = dict(GuardianRequest.objects.values_list("memory_ref", "text"))
    assert texts == {cast["memory"].pk: "", other.pk: "keep this proposal"}
    cert = ErasureCertificate.objects.get(memory_ref=cast["memory"].pk)
    assert cert.counts.get("guardian_request_texts") == 1


def test_the_child_page_shows_what_the_next_decay_pass_forgets_and_the_schools_policy() -> None:
    cast = _cast()
    old = memory_create(stack=cast["child"], kind="note", payload={"content": "an old note nobody used"},
                        source="test")
    Memory.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=900))
    page = cast["family"].get(f"/dashboard/family/{cast['child'].slug}/").content.decode()
    fading = page[page.index('id="fading"'):page.index('id="school-policy"')]
    assert "an old note nobody used" in fading and SECRET_TEXT not in fading
    assert "How long it is kept" in page and "Riverside Primary" in page
