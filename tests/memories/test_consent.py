"""Consent and pause (docs/consent.md): the services, the API, and their enforcement by the write
kernel's gate on every write path (native create / batch / update, smart ingest, checkpoint, boot
config, native push, kernle push), with reads unaffected and erasure still possible."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.http import StreamingHttpResponse
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import AuditEvent, Membership, Organization, User
from accounts.principal import Principal
from accounts.throttles import throttle_state_clear
from memories.governance.consent import consent_give, consent_state, consent_withdraw, memory_pause, memory_resume
from memories.models import BootConfigEntry, Checkpoint, ErasureCertificate, Memory
from memoryhub.errors import Forbidden
from stacks.models import GuardianLink, Stack, StackConsent
from tests.actors import School
from tests.factories import bearer_client, make_key, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_throttles() -> Iterator[None]:
    throttle_state_clear()
    yield


def signed_in(user: User) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def require_consent(school: School, **settings: Any) -> None:
    org = Organization.objects.get(pk=school.org.pk)
    org.consent_required = True
    for name, value in settings.items():
        setattr(org, name, value)
    org.save()  # a save: every cached credential of the school is refreshed (accounts.key_cache)


def admin_of(school: School) -> Principal:
    return Principal(user=school.admin, organization=Organization.objects.get(pk=school.org.pk),
                     role=Membership.Role.ADMIN)


def guardian_of(school: School, stack: Stack) -> tuple[User, Principal]:
    user = make_user(school.org, role=Membership.Role.GUARDIAN, first_name="Gwen", last_name="Parent")
    GuardianLink.objects.create(user=user, stack=stack)
    return user, Principal(user=user, organization=Organization.objects.get(pk=school.org.pk),
                           role=Membership.Role.GUARDIAN)


def fresh(stack: Stack) -> Stack:
    row = Stack.objects.select_related("organization").get(pk=stack.pk)
    return row


NOTE = {"kind": "note", "content": "Fractions make sense with pizza slices"}


def native_op(record_id: str) -> dict[str, Any]:
    return {"op": "upsert", "kind": "note", "record_id": record_id, "updated_at": "2026-11-21T23:00:00+00:00",
            "data": {"content": "Common denominators first"}}


def kernle_episode(record_id: str, stack_id: str) -> dict[str, Any]:
    when = "2026-11-21T23:00:00+00:00"
    data = {"id": record_id, "stack_id": stack_id, "objective": "Fractions unit", "outcome": "success",
            "outcome_type": "success", "lessons": ["Pictures help"], "tags": [], "created_at": when,
            "local_updated_at": when, "cloud_synced_at": None, "version": 1, "deleted": False}
    return {"operation": "update", "table": "episodes", "record_id": record_id, "local_updated_at": when,
            "version": 1, "data": data}


def every_write(school: School, tag: str) -> dict[str, Any]:
    """Each write path once, as the student's agent: the responses by path."""
    agent, slug = school.agent, school.stack.slug
    return {
        "create": agent.post(school.stack_url("memories"), NOTE, format="json"),
        "batch": agent.post(school.stack_url("memories/batch"), {"items": [NOTE]}, format="json"),
        "ingest": agent.post(school.stack_url("ingest"), {"kind": "note", "content": f"Ingest {tag}"},
                             format="json"),
        "checkpoint": agent.post(school.stack_url("checkpoint"), {"task": "Fractions"}, format="json"),
        "boot": agent.put(school.stack_url("boot-config/tone"), {"value": "warm"}, format="json"),
        "native_push": agent.post(school.stack_url("sync/push"), {"operations": [native_op(f"n-{tag}")]},
                                  format="json"),
        "kernle_push": agent.post("/sync/push", {"stack_id": slug, "operations": [kernle_episode(f"e-{tag}", slug)]},
                                  format="json"),
    }


def assert_all_refused(responses: dict[str, Any], code: str) -> None:
    for path in ("create", "batch", "ingest", "checkpoint", "boot"):
        response = responses[path]
        assert response.status_code == 403, (path, response.content)
        assert response.json()["error"]["code"] == code, path
    native = responses["native_push"].json()
    assert native["applied"] == 0 and native["results"][0]["status"] == "rejected"
    assert native["results"][0]["error"]["code"] == code
    kernle = responses["kernle_push"].json()
    assert responses["kernle_push"].status_code == 200 and kernle["synced"] == 0
    assert len(kernle["conflicts"]) == 1 and f"({code})" in kernle["conflicts"][0]["error"]
    assert kernle["conflicts"][0]["record_id"].startswith("e-")  # refused per operation, the push answered 200


def nothing_stored(stack: Stack) -> None:
    assert not Memory.objects.filter(stack=stack).exists()
    assert not Checkpoint.objects.filter(stack=stack).exists()
    assert not BootConfigEntry.objects.filter(stack=stack).exists()


# --- enforcement ---------------------------------------------------------------------------------

def test_without_consent_every_write_path_is_refused_and_nothing_is_stored(school: School) -> None:
    require_consent(school)
    responses = every_write(school, "a")
    assert_all_refused(responses, "consent_required")
    nothing_stored(school.stack)
    # Reads go on: nothing to read, but no refusal either.
    assert school.agent.get(school.stack_url("memories")).status_code == 200
    assert school.agent.post(school.stack_url("search"), {"query": "pizza"}, format="json").status_code == 200
    assert school.agent.post("/sync/pull", {"stack_id": school.stack.slug, "since": None},
                             format="json").status_code == 200


def test_consent_given_opens_every_path_and_withdrawal_closes_them_again(school: School) -> None:
    require_consent(school)
    consent_give(fresh(school.stack), by=admin_of(school), method=StackConsent.Method.PAPER, note="form in office")
    responses = every_write(school, "b")
    assert responses["create"].status_code == 201, responses["create"].content
    assert responses["batch"].status_code == 201, responses["batch"].content
    assert responses["ingest"].status_code in (200, 201), responses["ingest"].content
    assert responses["checkpoint"].status_code == 201, responses["checkpoint"].content
    assert responses["boot"].status_code == 200, responses["boot"].content
    assert responses["native_push"].json()["applied"] == 1
    assert responses["kernle_push"].json()["synced"] == 1
    stored = Memory.objects.filter(stack=school.stack).count()
    assert stored == 5  # create, batch, ingest, native push, kernle push

    consent_withdraw(fresh(school.stack), by=admin_of(school), method=StackConsent.Method.PAPER)
    assert_all_refused(every_write(school, "c"), "consent_required")
    assert Memory.objects.filter(stack=school.stack).count() == stored  # "keep": the data stays


def test_an_update_of_a_stored_memory_is_refused_while_paused(school: School) -> None:
    created = school.agent.post(school.stack_url("memories"), NOTE, format="json").json()
    memory_pause(fresh(school.stack), by=admin_of(school))
    response = school.agent.patch(school.stack_url(f"memories/{created['id']}"),
                                  {"content": "Changed"}, format="json")
    assert response.status_code == 403 and response.json()["error"]["code"] == "memory_paused"
    assert Memory.objects.get(pk=created["id"]).text == NOTE["content"]


def test_pause_refuses_every_write_keeps_reads_and_resume_restores_writes(school: School) -> None:
    kept = school.agent.post(school.stack_url("memories"), NOTE, format="json").json()
    memory_pause(fresh(school.stack), by=admin_of(school))
    assert_all_refused(every_write(school, "p"), "memory_paused")
    assert [str(pk) for pk in Memory.objects.filter(stack=school.stack).values_list("pk", flat=True)] == [kept["id"]]
    # Reads: list, get, load, search, pull.
    assert school.agent.get(school.stack_url(f"memories/{kept['id']}")).status_code == 200
    assert school.agent.get(school.stack_url("load")).status_code == 200
    assert school.agent.post(school.stack_url("search"), {"query": "pizza"}, format="json").status_code == 200
    pulled = school.agent.get(school.stack_url("sync/pull"))
    assert pulled.status_code == 200, pulled.content
    kernle = school.agent.post("/sync/pull", {"stack_id": school.stack.slug, "since": None}, format="json")
    assert kernle.status_code == 200 and len(kernle.json()["operations"]) == 1
    # Staff may still forget what is stored.
    forgot = school.admin_api.post(school.stack_url(f"memories/{kept['id']}/forget"), {"reason": "parent asked"},
                                   format="json")
    assert forgot.status_code == 200, forgot.content

    memory_resume(fresh(school.stack), by=admin_of(school))
    assert school.agent.post(school.stack_url("memories"), NOTE, format="json").status_code == 201


def test_a_paused_stack_without_consent_can_still_be_erased(school: School) -> None:
    school.agent.post(school.stack_url("memories"), NOTE, format="json")
    require_consent(school)
    memory_pause(fresh(school.stack), by=admin_of(school))
    response = school.admin_api.post(school.stack_url("erase"), {"requested_by": "parent letter",
                                                                  "confirm": school.stack.slug}, format="json")
    assert response.status_code == 200, response.content
    assert not Memory.objects.filter(stack=school.stack).exists()


def test_another_stack_of_the_school_is_not_affected(school: School) -> None:
    memory_pause(fresh(school.stack), by=admin_of(school))
    _, secret = make_key(school.org, stack=school.other_stack)
    created = bearer_client(secret).post(f"/api/v1/stacks/{school.other_stack.slug}/memories", NOTE, format="json")
    assert created.status_code == 201, created.content


# --- the services ----------------------------------------------------------------------------------

def test_guardian_gives_and_withdraws_online_consent_with_history_and_audit(school: School) -> None:
    require_consent(school)
    _, guardian = guardian_of(school, school.stack)
    state = consent_give(fresh(school.stack), by=guardian, method=StackConsent.Method.ONLINE, ip="10.0.0.1",
                         session_ref="abc")
    assert state.in_force and state.writes_allowed and state.history[0].by == "guardian Gwen Parent"
    row = StackConsent.objects.get(stack=school.stack)
    assert row.text == state.text and row.ip == "10.0.0.1" and row.session_ref == "abc"
    state, certificate = consent_withdraw(fresh(school.stack), by=guardian, method=StackConsent.Method.ONLINE)
    assert certificate is None and not state.in_force and not state.writes_allowed
    assert [s.action for s in state.history] == ["withdrawn", "given"]
    assert list(AuditEvent.objects.filter(organization=school.org, action__startswith="consent.")
                .order_by("created_at").values_list("action", flat=True)) == ["consent.given", "consent.withdrawn"]


def test_who_may_record_consent_and_pause(school: School) -> None:
    _, guardian = guardian_of(school, school.stack)
    teacher = Principal(user=school.teacher, organization=school.org, role=Membership.Role.TEACHER)
    with pytest.raises(Forbidden) as refused:
        consent_give(fresh(school.stack), by=guardian, method=StackConsent.Method.PAPER)
    assert refused.value.code == "admin_required"
    with pytest.raises(Forbidden) as refused:
        consent_give(fresh(school.stack), by=admin_of(school), method=StackConsent.Method.ONLINE)
    assert refused.value.code == "guardian_required"
    with pytest.raises(Forbidden):
        memory_pause(fresh(school.stack), by=teacher)
    memory_pause(fresh(school.stack), by=guardian)  # guardians may pause by default
    assert fresh(school.stack).paused_by_id == guardian.user.pk
    memory_resume(fresh(school.stack), by=guardian)
    require_consent(school, guardians_may_pause=False)
    with pytest.raises(Forbidden) as refused:
        memory_pause(fresh(school.stack), by=guardian)
    assert refused.value.code == "guardian_pause_off"
    assert fresh(school.stack).paused_at is None
    assert not StackConsent.objects.exists()


def test_withdrawal_under_erase_erases_the_stack_with_a_certificate(school: School) -> None:
    school.agent.post(school.stack_url("memories"), NOTE, format="json")
    require_consent(school, consent_withdrawal=Organization.ConsentWithdrawal.ERASE)
    Stack.objects.filter(pk=school.stack.pk).update(consent_given_at=timezone.now())
    _, guardian = guardian_of(school, school.stack)
    state, certificate = consent_withdraw(fresh(school.stack), by=guardian, method=StackConsent.Method.ONLINE)
    assert certificate is not None and certificate.status == ErasureCertificate.Status.DONE
    assert "consent withdrawn by guardian Gwen Parent" in certificate.requested_by
    assert not Memory.objects.filter(stack=school.stack).exists()
    assert not state.in_force


# --- the API ---------------------------------------------------------------------------------------

def test_consent_api_records_paper_consent_and_lists_history_newest_first(school: School) -> None:
    require_consent(school)
    admin = signed_in(school.admin)
    url = school.stack_url("consent")
    given = admin.post(url, {"action": "given", "note": "signed form, office drawer 2"}, format="json")
    assert given.status_code == 200, given.content
    assert given.json()["in_force"] is True and given.json()["required"] is True
    withdrawn = school.admin_api.post(url, {"action": "withdrawn"}, format="json")
    assert withdrawn.status_code == 200 and withdrawn.json()["erasure"] is None
    again = admin.post(url, {"action": "given"}, format="json").json()
    assert [(s["action"], s["method"]) for s in again["history"]] == [
        ("given", "paper"), ("withdrawn", "paper"), ("given", "paper")]
    assert again["history"][2]["note"] == "signed form, office drawer 2"
    assert again["history"][2]["by"] in (school.admin.get_full_name(), school.admin.email)
    read = signed_in(school.teacher).get(url)
    assert read.status_code == 200 and read.json()["history"] == again["history"]
    assert admin.post(url, {"action": "given"}, format="json").json()["error"]["code"] == "consent_already_given"


def test_consent_and_pause_api_refusals_per_role(school: School, other_school: School) -> None:
    url, pause = school.stack_url("consent"), school.stack_url("pause")
    assert APIClient().get(url).status_code == 401
    assert APIClient().post(pause).status_code == 401
    teacher = signed_in(school.teacher)
    assert teacher.post(url, {"action": "given"}, format="json").status_code == 403
    assert teacher.post(pause).status_code == 403
    assert school.agent.post(pause).status_code == 403
    assert school.agent.get(url).status_code == 403
    # A stack the caller cannot see: 404 (the teacher is not assigned to "bob"; another school's admin).
    assert teacher.get(school.stack_url("consent").replace(school.stack.slug, school.other_stack.slug)
                       ).status_code == 404
    assert signed_in(other_school.admin).post(pause).status_code == 404
    assert other_school.admin_api.get(url).status_code == 404
    assert signed_in(other_school.admin).post(url, {"action": "given"}, format="json").status_code == 404
    assert fresh(school.stack).paused_at is None and not StackConsent.objects.exists()
    # Bad input: 400, nothing recorded.
    assert signed_in(school.admin).post(url, {"action": "maybe"}, format="json").status_code == 400


def test_pause_and_resume_api(school: School) -> None:
    admin = signed_in(school.admin)
    paused = admin.post(school.stack_url("pause"))
    assert paused.status_code == 200, paused.content
    assert paused.json()["paused"] is True and paused.json()["writes_allowed"] is False
    refused = school.agent.post(school.stack_url("memories"), NOTE, format="json")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "memory_paused"
    resumed = admin.post(school.stack_url("resume"))
    assert resumed.status_code == 200 and resumed.json()["paused"] is False
    assert school.agent.post(school.stack_url("memories"), NOTE, format="json").status_code == 201
    assert list(AuditEvent.objects.filter(organization=school.org, action__startswith="stack.memory_")
                .order_by("created_at").values_list("action", flat=True)) == [
        "stack.memory_paused", "stack.memory_resumed"]


def test_privacy_api_changes_the_consent_settings(school: School) -> None:
    response = school.admin_api.put("/api/v1/privacy", {"consent_required": True, "consent_withdrawal": "erase",
                                                        "consent_text": "We agree.", "guardians_may_pause": False},
                                    format="json")
    assert response.status_code == 200, response.content
    org = Organization.objects.get(pk=school.org.pk)
    assert (org.consent_required, org.consent_withdrawal, org.consent_text, org.guardians_may_pause) == (
        True, "erase", "We agree.", False)
    assert consent_state(fresh(school.stack)).text == "We agree."
    bad = school.admin_api.put("/api/v1/privacy", {"consent_withdrawal": "shred"}, format="json")
    assert bad.status_code == 400
    refused = school.agent.post(school.stack_url("memories"), NOTE, format="json")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "consent_required"


def test_the_operators_archive_import_is_not_refused_but_the_restored_students_agents_are(
        school: School, tmp_path: Path) -> None:
    agent = school.agent
    assert agent.post(school.stack_url("memories"), NOTE, format="json").status_code == 201
    assert agent.post(school.stack_url("checkpoint"), {"task": "Fractions"}, format="json").status_code == 201
    assert agent.put(school.stack_url("boot-config/tone"), {"value": "warm"}, format="json").status_code == 200
    exported = agent.get(school.stack_url("export/archive"))
    path = tmp_path / "alice.zip"
    assert isinstance(exported, StreamingHttpResponse)
    path.write_bytes(b"".join(exported.streaming_content))
    require_consent(school)
    out = io.StringIO()
    call_command("import_archive", str(path), "--school", school.org.slug, "--stack", "alice-restored",
                 stdout=out, stderr=io.StringIO())
    assert "0 rejected" in out.getvalue()
    restored = Stack.objects.get(organization=school.org, slug="alice-restored")
    assert Memory.objects.filter(stack=restored).count() == 1
    assert Checkpoint.objects.filter(stack=restored).count() == 1
    assert BootConfigEntry.objects.filter(stack=restored).count() == 1
    _, secret = make_key(school.org, stack=restored)
    refused = bearer_client(secret).post("/api/v1/stacks/alice-restored/memories", NOTE, format="json")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "consent_required"
