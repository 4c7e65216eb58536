"""The dashboard's privacy pages (docs/privacy.md "The Privacy page"): the school's privacy settings with their written
retention policy, the erasure certificates, erasing a student or one memory from the student's
pages, the archive export button, and the redaction report shown without values.

Who reaches what: admins of the school only (teachers and billing users get 404); another school's
student, memory or certificate is a 404 and nothing of it changes."""

from __future__ import annotations

import io
import json
import zipfile
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from accounts.models import AuditEvent, Membership, Organization
from memories.governance import erasure
from memories.governance.erasure import erasure_run
from memories.lifecycle.ttl import DEFAULT_RETENTION_DAYS
from memories.models import ErasureCertificate, Memory
from memories.privacy.redaction.rules import PII_CATEGORIES
from memories.services import CheckpointInput, checkpoint_save, memory_create
from stacks.models import Stack
from tests.actors import School
from tests.dashboard.pages import client_for
from tests.factories import make_user

pytestmark = pytest.mark.django_db

PRIVACY = reverse("dashboard:privacy")
SETTINGS = ("retention_days", "redaction_categories", "empty_grants_policy", "keep_raw_originals")


def note(stack: Stack, content: str, **fields: Any) -> Memory:
    return memory_create(stack=stack, kind="note", payload={"content": content, **fields}, source="api")


def stored(org: Organization) -> dict[str, Any]:
    row = Organization.objects.get(pk=org.pk)
    return {name: getattr(row, name) for name in SETTINGS}


DEFAULT_STORED: dict[str, Any] = {"retention_days": DEFAULT_RETENTION_DAYS, "redaction_categories": None,
                                  "empty_grants_policy": "school",
                  "keep_raw_originals": False}


def settings_form(**overrides: Any) -> dict[str, Any]:
    """What the settings form posts when nothing is changed (every PII box ticked, staff policy)."""
    return {"redaction_categories": list(PII_CATEGORIES), "empty_grants_policy": "school", **overrides}


def erase_url(stack: Stack) -> str:
    return reverse("dashboard:student-erase", args=[stack.slug])


def memory_erase_url(memory: Memory) -> str:
    return reverse("dashboard:memory-erase", args=[memory.stack.slug, memory.pk])


def archive_url(stack: Stack) -> str:
    return reverse("dashboard:student-export-archive", args=[stack.slug])


def streamed(response: Any) -> bytes:
    return b"".join(response.streaming_content)


# --- the settings page --------------------------------------------------------------------------------

def test_admin_sees_settings_defaults_policy_and_the_nav_entry(school: School) -> None:
    response = client_for(school.admin).get(PRIVACY)
    assert response.status_code == 200
    body = response.content.decode()
    assert f'href="{PRIVACY}" aria-current="page"' in body  # the navigation's Privacy entry
    for heading in ("What is kept", "How long it is kept", "Who can see it", "What erasure does"):
        assert heading in body
    # A new school's written policy has a limit for every kind.
    assert "Raw entries: 365 days (1 year) after they are written." in body
    assert "Playbooks: 1095 days (3 years) after they are written." in body and "No time limit" not in body
    assert 'name="retention_raw" id="id_retention_raw" value="365"' in body
    assert '<td class="muted small">365 days</td>' in body and '<td class="muted small">no limit</td>' not in body
    assert 'id="always-secrets" checked disabled' in body  # secrets: always on, not a choice
    for category in PII_CATEGORIES:
        assert f'value="{category}"' in body
    assert body.count('name="redaction_categories" value=') == len(PII_CATEGORIES)
    assert body.count("checked") >= len(PII_CATEGORIES) + 1
    assert "MEMORYHUB_ENCRYPTION_KEYS" in body
    assert 'name="retention_raw"' in body and 'name="retention_playbook"' in body
    assert "No erasures yet." in body


def test_settings_round_trip_audited_post_redirect_get(school: School, other_school: School) -> None:
    client = client_for(school.admin)
    form = settings_form(retention_raw="365", retention_episode="730", redaction_categories=["EMAIL"],
                         empty_grants_policy="owner", keep_raw_originals="on")
    response = client.post(PRIVACY, form, REMOTE_ADDR="203.0.113.9")
    assert response.status_code == 302 and response["Location"] == PRIVACY
    assert stored(school.org) == {"retention_days": {"raw": 365, "episode": 730},
                                  "redaction_categories": ["EMAIL"], "empty_grants_policy": "owner",
                                  "keep_raw_originals": True}
    event = AuditEvent.objects.get(organization=school.org, action="privacy.updated")
    assert event.actor == school.admin and event.ip == "203.0.113.9"
    assert set(event.metadata["changed"]) == set(SETTINGS)
    page = client.get(PRIVACY).content.decode()
    assert "Privacy settings saved" in page
    assert "Raw entries: 365 days (1 year) after they are written." in page
    assert 'name="retention_raw" id="id_retention_raw" value="365"' in page
    assert "only by the student&#x27;s own agent" in page
    # The other school keeps its defaults.
    assert stored(other_school.org) == DEFAULT_STORED

    # Saving again unchanged writes nothing and audits nothing; emptying a field removes that limit.
    client.post(PRIVACY, form)
    assert AuditEvent.objects.filter(organization=school.org, action="privacy.updated").count() == 1
    client.post(PRIVACY, {**form, "retention_raw": ""})
    assert stored(school.org)["retention_days"] == {"episode": 730}


def test_every_box_ticked_stores_all_and_none_ticked_redacts_no_pii(school: School) -> None:
    client = client_for(school.admin)
    client.post(PRIVACY, settings_form(redaction_categories=[]))
    assert stored(school.org)["redaction_categories"] == []
    client.post(PRIVACY, settings_form())
    assert stored(school.org)["redaction_categories"] is None


@pytest.mark.parametrize("change,field", [
    ({"retention_raw": "0"}, "retention_raw"),
    ({"retention_note": "-5"}, "retention_note"),
    ({"retention_note": "ten"}, "retention_note"),
    ({"retention_goal": "36501"}, "retention_goal"),
    ({"redaction_categories": ["EMAIL", "SHOE_SIZE"]}, "redaction_categories"),
    ({"empty_grants_policy": "everyone"}, "empty_grants_policy"),
    ({"empty_grants_policy": ""}, "empty_grants_policy"),
])
def test_bad_input_re_renders_with_400_and_stores_nothing(school: School, change: dict[str, Any],
                                                          field: str) -> None:
    # A valid change next to the bad one is not stored either: all or nothing.
    form = settings_form(**{"retention_episode": "30", "keep_raw_originals": "on", **change})
    response = client_for(school.admin).post(PRIVACY, form)
    assert response.status_code == 400
    body = response.content.decode()
    assert "Please correct the errors below." in body
    assert 'class="errorlist"' in body
    assert response.context["form"].errors[field]
    assert stored(school.org) == DEFAULT_STORED
    assert not AuditEvent.objects.filter(action="privacy.updated").exists()


# --- who reaches the pages -------------------------------------------------------------------------------

def _other_school_certificate(other_school: School) -> ErasureCertificate:
    note(other_school.stack, "Their memory")
    client_for(other_school.admin).post(erase_url(other_school.stack), {"confirm": other_school.stack.slug})
    return ErasureCertificate.objects.get(organization=other_school.org)


@pytest.mark.parametrize("who", ["teacher", "billing"])
def test_teachers_and_billing_users_get_404_everywhere(school: School, who: str) -> None:
    user = school.teacher if who == "teacher" else make_user(school.org, role=Membership.Role.BILLING)
    client = client_for(user)
    memory = note(school.stack, "Assigned student's memory")
    client_for(school.admin).post(memory_erase_url(note(school.stack, "to erase")))
    cert = ErasureCertificate.objects.get(organization=school.org)
    assert client.get(PRIVACY).status_code == 404
    assert client.post(PRIVACY, settings_form(keep_raw_originals="on")).status_code == 404
    assert client.get(reverse("dashboard:erasure", args=[cert.pk])).status_code == 404
    assert client.get(erase_url(school.stack)).status_code == 404
    assert client.post(erase_url(school.stack), {"confirm": school.stack.slug}).status_code == 404
    assert client.post(memory_erase_url(memory)).status_code == 404
    assert Memory.objects.filter(pk=memory.pk).exists()
    assert stored(school.org) == DEFAULT_STORED
    assert ErasureCertificate.objects.count() == 1
    nav = client.get(reverse("dashboard:billing")).content.decode()
    assert PRIVACY not in nav


def test_another_schools_students_memories_and_certificates_are_404(school: School, other_school: School) -> None:
    cert = _other_school_certificate(other_school)  # their admin erased one of their students
    theirs = note(other_school.other_stack, "Another student's memory")
    client = client_for(school.admin)
    assert client.get(erase_url(other_school.other_stack)).status_code == 404
    response = client.post(erase_url(other_school.other_stack), {"confirm": other_school.other_stack.slug,
                                                                 "requested_by": "a stranger"})
    assert response.status_code == 404
    assert client.post(memory_erase_url(theirs)).status_code == 404
    # Their memory under my student's address is not mine either.
    mine_url = reverse("dashboard:memory-erase", args=[school.stack.slug, theirs.pk])
    assert client.post(mine_url).status_code == 404
    assert client.get(reverse("dashboard:erasure", args=[cert.pk])).status_code == 404
    assert client.get(reverse("dashboard:erasure", args=["not-a-uuid"])).status_code == 404
    assert client.get(archive_url(other_school.other_stack)).status_code == 404
    # Nothing of theirs changed; my list shows none of their certificates.
    assert Memory.objects.filter(pk=theirs.pk).exists()
    assert Stack.objects.get(pk=other_school.other_stack.pk).status == Stack.Status.ACTIVE
    assert ErasureCertificate.objects.filter(organization=other_school.org).count() == 1
    assert not ErasureCertificate.objects.filter(organization=school.org).exists()
    assert str(cert.pk) not in client.get(PRIVACY).content.decode()


# --- erasing a student -----------------------------------------------------------------------------------

def test_erase_a_student_end_to_end(school: School) -> None:
    Stack.objects.filter(pk=school.stack.pk).update(display_name="Alice Liddell")
    for n in range(3):
        note(school.stack, f"Alice note {n}")
    memory_create(stack=school.stack, kind="belief", payload={"statement": "Alice likes puzzles"}, source="api")
    checkpoint_save(stack=school.stack, checkpoint=CheckpointInput(task="Fractions"))
    bobs = note(school.other_stack, "Bob keeps his memory")
    client = client_for(school.admin)

    page = client.get(reverse("dashboard:student", args=[school.stack.slug])).content.decode()
    assert erase_url(school.stack) in page and "Erase student…" in page
    confirm_page = client.get(erase_url(school.stack))
    assert confirm_page.status_code == 200
    assert "Erase Alice Liddell" in confirm_page.content.decode()
    assert "4 memories" in confirm_page.content.decode()

    # The wrong name is refused with 400 and erases nothing.
    response = client.post(erase_url(school.stack), {"confirm": "Bob", "requested_by": "Alice's mother"})
    assert response.status_code == 400
    assert "nothing was erased" in response.content.decode()
    assert Memory.objects.filter(stack=school.stack).count() == 4
    assert not ErasureCertificate.objects.exists()

    # Her name, typed in any case, erases her; the admin lands on the certificate.
    response = client.post(erase_url(school.stack), {"confirm": " alice liddell ",
                                                     "requested_by": "Alice's mother, letter of 20 Nov 2026"},
                           REMOTE_ADDR="198.51.100.4")
    cert = ErasureCertificate.objects.get()
    certificate_url = reverse("dashboard:erasure", args=[cert.pk])
    assert response.status_code == 302 and response["Location"] == certificate_url
    assert cert.status == "done" and cert.scope == "stack"
    assert cert.counts["memory:note"] == 3 and cert.counts["memory:belief"] == 1
    assert cert.counts["checkpoints"] == 1
    assert not Memory.objects.filter(stack=school.stack).exists()
    assert Memory.objects.filter(pk=bobs.pk).exists()  # the other student is untouched
    assert Stack.objects.get(pk=school.stack.pk).status == Stack.Status.ARCHIVED

    page = client.get(certificate_url).content.decode()
    assert "MemoryHub certifies that this data was erased irreversibly" in page
    assert "Alice&#x27;s mother, letter of 20 Nov 2026" in page
    assert "Memories: notes</td><td class=\"num\">3</td>" in page
    assert "Memories: beliefs</td><td class=\"num\">1</td>" in page
    assert "Valid</span>" in page and cert.digest in page
    printable_url = reverse("erasure-detail", args=[cert.pk]) + "?format=html"
    assert printable_url in page
    printable = client.get(printable_url)  # the signed-in admin's session opens the printable page
    assert printable.status_code == 200 and "Certificate of erasure" in printable.content.decode()
    assert "Alice note" not in page
    # Anyone can check it.
    verify = Client().get(reverse("erasure-verify", args=[cert.pk]))
    assert verify.status_code == 200 and verify.json() == {"valid": True}
    # Audited, with the admin's address; the list on the privacy page links it.
    requested = AuditEvent.objects.get(action="stack.erasure_requested")
    assert requested.actor == school.admin and requested.ip == "198.51.100.4"
    assert AuditEvent.objects.filter(action="stack.erased", target_id=str(school.stack.pk)).exists()
    listing = client.get(PRIVACY).content.decode()
    assert certificate_url in listing and "the whole student" in listing


def test_the_student_id_confirms_too_and_requested_by_is_optional(school: School) -> None:
    note(school.stack, "One memory")
    response = client_for(school.admin).post(erase_url(school.stack), {"confirm": school.stack.slug})
    assert response.status_code == 302
    cert = ErasureCertificate.objects.get()
    assert cert.status == "done"
    assert cert.requested_by.startswith(school.org.name) and "own decision" in cert.requested_by


def test_an_empty_confirmation_is_400(school: School) -> None:
    note(school.stack, "One memory")
    response = client_for(school.admin).post(erase_url(school.stack), {"confirm": ""})
    assert response.status_code == 400
    assert Memory.objects.filter(stack=school.stack).count() == 1


def test_a_large_student_shows_the_jobs_progress_then_the_certificate(school: School, monkeypatch: Any) -> None:
    monkeypatch.setattr(erasure, "ASYNC_THRESHOLD", 2)
    for n in range(4):
        note(school.stack, f"memory {n}")
    client = client_for(school.admin)
    response = client.post(erase_url(school.stack), {"confirm": school.stack.slug})
    cert = ErasureCertificate.objects.get()
    # The job is queued after commit (the test's transaction never commits): still pending.
    assert cert.status == "pending"
    url = reverse("dashboard:erasure", args=[cert.pk])
    assert response["Location"] == url
    page = client.get(url).content.decode()
    assert 'id="erasure-progress"' in page and 'hx-trigger="every 2s"' in page
    assert "0 memories erased so far, 4 left" in page
    polled = client.get(url, HTTP_HX_REQUEST="true")
    assert polled.status_code == 200 and "Erasing…" in polled.content.decode()
    assert "<html" not in polled.content.decode()
    erasure_run(cert.pk)  # what the worker does
    polled = client.get(url, HTTP_HX_REQUEST="true")
    assert polled.status_code == 204 and polled["HX-Refresh"] == "true"
    page = client.get(url).content.decode()
    assert "erasure-progress" not in page and "Valid</span>" in page


# --- erasing one memory ----------------------------------------------------------------------------------

def test_erase_one_memory_from_its_page(school: School) -> None:
    keep = note(school.stack, "Stays")
    gone = note(school.stack, "Goes for good")
    client = client_for(school.admin)
    detail = client.get(reverse("dashboard:memory", args=[school.stack.slug, gone.pk])).content.decode()
    assert memory_erase_url(gone) in detail and "Erase this memory" in detail
    teacher_view = client_for(school.teacher).get(reverse("dashboard:memory", args=[school.stack.slug, gone.pk]))
    assert memory_erase_url(gone) not in teacher_view.content.decode()

    response = client.post(memory_erase_url(gone), {"requested_by": "Parent"})
    cert = ErasureCertificate.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("dashboard:erasure", args=[cert.pk])
    assert cert.scope == "memory" and cert.memory_ref == gone.pk and cert.counts == {"memory:note": 1}
    assert not Memory.objects.filter(pk=gone.pk).exists() and Memory.objects.filter(pk=keep.pk).exists()
    assert Stack.objects.get(pk=school.stack.pk).status == Stack.Status.ACTIVE
    page = client.get(reverse("dashboard:erasure", args=[cert.pk])).content.decode()
    assert "One memory" in page and str(gone.pk) in page and "Valid</span>" in page
    assert AuditEvent.objects.filter(action="memory.erasure_requested", actor=school.admin).exists()


def test_erasing_a_memory_needs_a_post_and_a_sane_requester(school: School) -> None:
    memory = note(school.stack, "Stays")
    client = client_for(school.admin)
    assert client.get(memory_erase_url(memory)).status_code == 405
    assert client.post(memory_erase_url(memory), {"requested_by": "x" * 1001}).status_code == 400
    assert Memory.objects.filter(pk=memory.pk).exists()


# --- export and the redaction report ---------------------------------------------------------------------

def test_export_archive_button_streams_the_zip_with_its_manifest_and_is_audited(school: School) -> None:
    note(school.stack, "Pizza fractions")
    page = client_for(school.teacher).get(reverse("dashboard:student", args=[school.stack.slug])).content.decode()
    assert archive_url(school.stack) in page and "Export archive" in page
    assert erase_url(school.stack) not in page  # teachers do not erase
    response = client_for(school.teacher).get(archive_url(school.stack))
    assert response.status_code == 200 and response.streaming
    assert response["Content-Type"] == "application/zip"
    assert response["Content-Disposition"].startswith(f'attachment; filename="memoryhub-{school.stack.slug}-')
    archive = zipfile.ZipFile(io.BytesIO(streamed(response)))
    manifest = json.loads(archive.read("manifest.json"))
    assert manifest["stack"]["slug"] == school.stack.slug
    assert "Pizza fractions" in archive.read("memories/note.jsonl").decode()
    event = AuditEvent.objects.get(action="stack.exported")
    assert event.actor == school.teacher and event.target_id == school.stack.slug
    assert event.metadata == {"format": "zip"}
    # An unassigned teacher reaches neither the button nor the archive.
    assert client_for(school.teacher).get(archive_url(school.other_stack)).status_code == 404


def test_redaction_report_shows_rules_and_counts_never_values(school: School) -> None:
    memory = note(school.stack, "Mum is mum@example.org, dad is dad@example.org, call 555-123-4567")
    assert memory.redaction_report
    client = client_for(school.admin)
    row = client.get(reverse("dashboard:student", args=[school.stack.slug])).content.decode()
    assert "redacted: email \u00d72, phone \u00d71" in row  # rule \u00d7 count
    detail = client.get(reverse("dashboard:memory", args=[school.stack.slug, memory.pk])).content.decode()
    assert "email \u00d7 2" in detail and "phone \u00d7 1" in detail
    for value in ("mum@example.org", "dad@example.org", "555-123-4567"):
        assert value not in row and value not in detail
    plain = note(school.stack, "Nothing personal here")
    row = client.get(reverse("dashboard:student", args=[school.stack.slug])).content.decode()
    assert row.count("redacted:") == 1
    assert not plain.redaction_report
