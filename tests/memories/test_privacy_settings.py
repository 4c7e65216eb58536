"""A school's privacy settings: `GET/PUT /api/v1/privacy` and memories.governance.privacy_settings —
one audited change of retention, PII categories, empty-grants policy and the raw-originals opt-in;
school admins only; invalid input is a 400 that changes nothing; one school never sees another's."""

from __future__ import annotations

from typing import Any

import pytest

from accounts.models import AuditEvent, Membership, Organization
from memories.governance.privacy_settings import DEFAULTS, policy_sections, privacy_settings_get
from memories.lifecycle.ttl import DEFAULT_RETENTION_DAYS
from memories.models import MemoryKind
from memories.privacy.redaction.rules import PII_CATEGORIES
from memories.services import memory_create
from stacks.models import Stack
from tests.actors import School
from tests.factories import bearer_client, make_key, make_user, session_client

pytestmark = pytest.mark.django_db

URL = "/api/v1/privacy"
STORED = ("retention_days", "redaction_categories", "empty_grants_policy", "keep_raw_originals")


def stored(org: Organization) -> dict[str, Any]:
    row = Organization.objects.get(pk=org.pk)
    return {name: getattr(row, name) for name in STORED}


def test_a_new_school_reads_the_defaults_and_its_written_policy(school: School) -> None:
    response = school.admin_api.get(URL)
    assert response.status_code == 200, response.content
    body = response.json()
    assert {name: body[name] for name in STORED} == {
        "retention_days": DEFAULT_RETENTION_DAYS, "redaction_categories": list(PII_CATEGORIES),
        "empty_grants_policy": "school",
        "keep_raw_originals": False}
    assert body["provision_stacks_on_push"] is False
    consent = {"consent_required": False, "consent_text": "", "consent_withdrawal": "keep", "guardians_may_pause": True,
               "guardian_request_days": 10}
    assert {name: body[name] for name in consent} == consent  # the families' settings (docs/consent.md)
    assert body["defaults"] == {name: body[name] for name in (*STORED, "provision_stacks_on_push", *consent)}
    assert body["pii_categories"] == list(PII_CATEGORIES)
    titles = [section["title"] for section in body["policy"]]
    assert titles == ["What is kept", "How long it is kept", "Who can see it", "What erasure does", "Getting a copy"]
    text = " ".join(p for section in body["policy"] for p in section["paragraphs"])
    # Finite for every kind: a policy a school can sign under COPPA.
    assert "Raw entries: 365 days (1 year) after they are written." in text
    assert "Notes: 1095 days (3 years) after they are written." in text
    assert "No time limit" not in text and body["retention_reviewed_at"] is None
    assert "cannot be undone" in text and "certificate" in text


def test_an_existing_school_without_limits_is_told_until_an_admin_confirms_no_limit(school: School) -> None:
    Organization.objects.filter(pk=school.org.pk).update(retention_days={})  # from before the defaults
    text = " ".join(p for s in school.admin_api.get(URL).json()["policy"] for p in s["paragraphs"])
    assert "No time limit is set for any kind of memory" in text and "COPPA" in text
    assert "has not reviewed this yet" in text

    # Saving "no limit" on purpose (the retention unchanged) records the choice, audited.
    response = school.admin_api.put(URL, {"retention_days": {}}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["retention_days"] == {} and body["retention_reviewed_at"] is not None
    text = " ".join(p for s in body["policy"] for p in s["paragraphs"])
    assert "admins chose this on" in text and "not reviewed" not in text and "COPPA does not bind" in text
    event = AuditEvent.objects.get(organization=school.org, action="privacy.updated")
    assert event.metadata == {"changed": {}, "retention_confirmed": True}


def test_settings_round_trip_in_one_audited_change(school: School, other_school: School) -> None:
    change = {"retention_days": {"raw": 365, "episode": 730}, "redaction_categories": ["email", "PHONE"],
              "empty_grants_policy": "owner", "keep_raw_originals": True}
    response = school.admin_api.put(URL, change, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["retention_days"] == {"raw": 365, "episode": 730}
    assert body["redaction_categories"] == ["EMAIL", "PHONE"]
    assert body["empty_grants_policy"] == "owner" and body["keep_raw_originals"] is True
    assert stored(school.org) == {"retention_days": {"raw": 365, "episode": 730},
                                  "redaction_categories": ["EMAIL", "PHONE"], "empty_grants_policy": "owner",
                                  "keep_raw_originals": True}
    assert school.admin_api.get(URL).json() == body
    # The policy text follows the settings.
    text = " ".join(p for section in body["policy"] for p in section["paragraphs"])
    assert "Raw entries: 365 days (1 year) after they are written." in text
    assert "Episodes: 730 days (2 years)" in text
    assert "e-mail addresses, phone numbers." in text
    assert "encrypted" in text and "only by the student's own agent" in text

    events = list(AuditEvent.objects.filter(organization=school.org, action="privacy.updated"))
    assert len(events) == 1
    assert events[0].actor == school.admin and events[0].actor_key == school.admin_key
    assert events[0].metadata["changed"]["empty_grants_policy"] == {"from": "school", "to": "owner"}
    assert events[0].metadata["changed"]["keep_raw_originals"] == {"from": False, "to": True}
    # The other school is untouched, and so is its audit log.
    assert stored(other_school.org) == {"retention_days": DEFAULT_RETENTION_DAYS, "redaction_categories": None,
                                        "empty_grants_policy": "school", "keep_raw_originals": False}
    assert not AuditEvent.objects.filter(organization=other_school.org, action="privacy.updated").exists()


def test_a_partial_change_keeps_the_rest_and_an_unchanged_one_writes_nothing(school: School) -> None:
    school.admin_api.put(URL, {"retention_days": {"raw": 30}}, format="json")
    response = school.admin_api.put(URL, {"keep_raw_originals": True}, format="json")
    assert response.status_code == 200
    assert stored(school.org)["retention_days"] == {"raw": 30}
    assert stored(school.org)["keep_raw_originals"] is True
    assert school.admin_api.put(URL, {"keep_raw_originals": True}, format="json").status_code == 200
    assert AuditEvent.objects.filter(organization=school.org, action="privacy.updated").count() == 2


def test_choosing_every_category_means_all_of_them_and_none_means_no_pii(school: School) -> None:
    school.admin_api.put(URL, {"redaction_categories": []}, format="json")
    assert stored(school.org)["redaction_categories"] == []
    assert school.admin_api.get(URL).json()["redaction_categories"] == []
    # With no PII category chosen an e-mail address is kept as written; a secret never is.
    stack = Stack.objects.select_related("organization").get(pk=school.stack.pk)  # as a request loads it
    memory = memory_create(stack=stack, kind=MemoryKind.NOTE, source="api", payload={
        "content": "Mum: ada.mum@example.org, key AKIAABCDEFGHIJKLMNOP"})
    assert "ada.mum@example.org" in memory.text and "AKIAABCDEFGHIJKLMNOP" not in memory.text
    school.admin_api.put(URL, {"redaction_categories": list(PII_CATEGORIES)}, format="json")
    assert stored(school.org)["redaction_categories"] is None  # "all", including categories added later


@pytest.mark.parametrize("body,field", [
    ({"retention_days": {"rawz": 365}}, "retention_days.rawz"),
    ({"retention_days": {"raw": 0}}, "retention_days.raw"),
    ({"retention_days": {"raw": "365"}}, "retention_days.raw"),
    ({"retention_days": [365]}, "retention_days"),
    ({"redaction_categories": ["EMAIL", "SHOE_SIZE"]}, "redaction_categories"),
    ({"redaction_categories": "EMAIL"}, "redaction_categories"),
    ({"empty_grants_policy": "everyone"}, "empty_grants_policy"),
    ({"empty_grants_policy": None}, "empty_grants_policy"),
    ({"keep_raw_originals": "yes"}, "keep_raw_originals"),
    ({"keep_raw_originals": 1}, "keep_raw_originals"),
])
def test_invalid_settings_are_a_clear_400_and_change_nothing(school: School, body: dict[str, Any],
                                                             field: str) -> None:
    # A valid setting next to the bad one is not applied either: all or nothing.
    response = school.admin_api.put(URL, {"empty_grants_policy": "owner", **body}, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_privacy_settings"
    assert field in error["fields"], error
    assert stored(school.org) == {"retention_days": DEFAULT_RETENTION_DAYS, "redaction_categories": None,
                                  "empty_grants_policy": "school", "keep_raw_originals": False}
    assert not AuditEvent.objects.filter(organization=school.org, action="privacy.updated").exists()


def test_unknown_settings_and_bodies_that_are_not_objects_are_400(school: School) -> None:
    response = school.admin_api.put(URL, {"retention_day": {"raw": 3}}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "unknown_field"
    assert "retention_day" in response.json()["error"]["fields"]
    response = school.admin_api.put(URL, ["keep_raw_originals"], format="json")
    assert response.status_code == 400
    assert stored(school.org)["retention_days"] == DEFAULT_RETENTION_DAYS


def test_only_school_admins_and_writable_school_keys(school: School) -> None:
    body = {"keep_raw_originals": True}
    _, read_only = make_key(school.org, user=school.admin, read_only=True)
    for client in (school.agent, bearer_client(read_only)):
        assert client.get(URL).status_code == 403
        response = client.put(URL, body, format="json")
        assert response.status_code == 403 and response.json()["error"]["code"] == "admin_required"
    # Signed-in staff (the dashboard's session): a teacher or a billing user may not read them, an admin may.
    billing = make_user(school.org, role=Membership.Role.BILLING)
    for user in (school.teacher, billing):
        response = session_client(user).get(URL)
        assert response.status_code == 403 and response.json()["error"]["code"] == "admin_required"
    assert session_client(school.admin).get(URL).status_code == 200
    assert stored(school.org)["keep_raw_originals"] is False
    assert not AuditEvent.objects.filter(organization=school.org, action="privacy.updated").exists()


def test_unauthenticated_is_401() -> None:
    from rest_framework.test import APIClient

    assert APIClient().get(URL).status_code == 401


def test_each_school_reads_and_changes_only_its_own(school: School, other_school: School) -> None:
    other_school.admin_api.put(URL, {"retention_days": {"note": 10}, "empty_grants_policy": "owner"}, format="json")
    mine = school.admin_api.get(URL).json()
    assert mine["retention_days"] == DEFAULT_RETENTION_DAYS and mine["empty_grants_policy"] == "school"
    assert privacy_settings_get(_principal(other_school)).retention_days == {"note": 10}


def _principal(cast: School) -> Any:
    from accounts.selectors import principal_for_session

    return principal_for_session(cast.admin)


def test_the_policy_of_the_defaults_names_every_section_once() -> None:
    sections = policy_sections(DEFAULTS, school="Hill School")
    assert len({s.title for s in sections}) == len(sections)
    assert all(s.paragraphs for s in sections)
    # Families are told that reads are recorded, and for how long the school keeps that record.
    who = " ".join(next(s for s in sections if s.title == "Who can see it").paragraphs)
    assert "access log" in who and "keeps that for 365 days" in who
    shorter = policy_sections(DEFAULTS, school="Hill School", access_log_days=90)
    assert "keeps that for 90 days" in " ".join(next(s for s in shorter if s.title == "Who can see it").paragraphs)
