"""Native memory API: every kind (valid, each invalid field, unknown fields kept, oversized refused
with nothing stored), update, list filters and pagination, forget/recover/protect, batch."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from memories.models import Memory, MemoryRevision
from stacks.models import Stack
from tests.actors import School

pytestmark = pytest.mark.django_db



@pytest.fixture
def url(school: School) -> str:
    return school.stack_url("memories")


VALID: dict[str, dict[str, Any]] = {
    "raw": {"content": "Student asked about fractions during lunch"},
    "episode": {"objective": "Practise fractions", "outcome": "Solved 8 of 10", "outcome_type": "partial",
                "lessons": ["Draw the pie first"], "repeat": ["visual models"], "avoid": ["rushing"]},
    "note": {"content": "Prefers visual explanations", "note_type": "insight", "speaker": "tutor",
             "reason": "observed twice"},
    "belief": {"statement": "Fractions are easier with pictures", "belief_type": "fact", "confidence": 0.9,
               "times_reinforced": 2, "is_active": True},
    "value": {"name": "curiosity", "statement": "Ask why before how", "priority": 80},
    "goal": {"title": "Master fractions", "description": "By June", "goal_type": "task", "priority": "high",
             "status": "active"},
    "drive": {"drive_type": "curiosity", "intensity": 0.7, "focus_areas": ["math", "space"]},
    "relationship": {"entity_name": "Ms. Rivera", "entity_type": "person", "relationship_type": "teacher",
                     "sentiment": 0.6, "interaction_count": 12, "notes": "Trusted"},
    "playbook": {"name": "Fraction warm-up", "description": "Start every session", "trigger_conditions": ["new"],
                 "steps": [{"action": "draw a pie"}, {"action": "split it"}], "failure_modes": ["boredom"],
                 "recovery_steps": ["switch to pizza"], "mastery_level": "novice"},
}

# For each kind, invalid payloads and the field the error must name.
INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("raw", {"content": ""}, "content"),
    ("episode", {"outcome": "x"}, "objective"),
    ("episode", {"objective": "x"}, "outcome"),
    ("episode", {**VALID["episode"], "lessons": "x" * 3000}, "lessons"),
    ("episode", {**VALID["episode"], "lessons": [{"a": 1}]}, "lessons"),
    ("episode", {**VALID["episode"], "emotional_valence": 2}, "emotional_valence"),
    ("note", {"note_type": "insight"}, "content"),
    ("note", {**VALID["note"], "speaker": ["a"]}, "speaker"),
    ("belief", {"statement": "   "}, "statement"),
    ("belief", {**VALID["belief"], "confidence": 1.5}, "confidence"),
    ("belief", {**VALID["belief"], "confidence": "high"}, "confidence"),
    ("belief", {**VALID["belief"], "times_reinforced": -1}, "times_reinforced"),
    ("belief", {**VALID["belief"], "is_active": "maybe"}, "is_active"),
    ("value", {"statement": "x"}, "name"),
    ("value", {**VALID["value"], "priority": 101}, "priority"),
    ("value", {**VALID["value"], "priority": 5.5}, "priority"),
    ("goal", {"description": "x"}, "title"),
    ("goal", {**VALID["goal"], "status": "exploded"}, "status"),
    ("goal", {**VALID["goal"], "priority": "whenever"}, "priority"),
    ("drive", {"intensity": 0.5}, "drive_type"),
    ("drive", {**VALID["drive"], "intensity": -0.1}, "intensity"),
    ("relationship", {**VALID["relationship"], "entity_name": None}, "entity_name"),
    ("relationship", {**VALID["relationship"], "sentiment": -2}, "sentiment"),
    ("relationship", {**VALID["relationship"], "interaction_count": "many"}, "interaction_count"),
    ("playbook", {**VALID["playbook"], "steps": "not a list"}, "steps"),
    ("playbook", {"name": "p"}, "description"),
    ("playbook", {**VALID["playbook"], "success_rate": 3}, "success_rate"),
    ("note", {**VALID["note"], "tags": "x" * 500}, "tags"),
    ("note", {**VALID["note"], "source_type": "rumour"}, "source_type"),
    ("note", {**VALID["note"], "expires_at": "next tuesday"}, "expires_at"),
]


def _stored(stack: Stack) -> int:
    return Memory.objects.filter(stack=stack).count()


@pytest.mark.parametrize("kind", list(VALID))
def test_create_each_kind_and_read_back(school: School, url: str, kind: str,
                                       django_capture_on_commit_callbacks: Any) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        response = school.agent.post(url, {"kind": kind, **VALID[kind], "extra": {"mystery_field": {"keep": [1, 2]}}},
                                     format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["kind"] == kind
    assert body["extra"] == {"mystery_field": {"keep": [1, 2]}}
    assert body["version"] == 1
    assert body["awaiting_embedding"] is True
    assert body["is_protected"] is (kind in ("value", "drive"))
    memory = Memory.objects.get(pk=body["id"])
    assert memory.stack_id == school.stack.pk
    assert memory.record_id == body["id"]
    assert memory.text  # canonical text derived from the kind's fields
    assert memory.size_bytes > 0
    assert memory.change_seq > 0
    read = school.agent.get(f"{url}/{body['id']}")
    assert read.status_code == 200
    assert read.json()["data"] == body["data"]
    school.stack.refresh_from_db()
    assert school.stack.memory_count == 1
    assert school.stack.bytes_used == memory.size_bytes


def test_canonical_text_per_kind(school: School, url: str) -> None:
    expected = {
        "episode": "Practise fractions\nSolved 8 of 10\nDraw the pie first",
        "value": "curiosity\nAsk why before how",
        "goal": "Master fractions\nBy June",
        "drive": "curiosity\nmath\nspace",
        "relationship": "Ms. Rivera\nTrusted",
        "playbook": "Fraction warm-up\nStart every session\ndraw a pie\nsplit it",
    }
    for kind, text in expected.items():
        response = school.agent.post(url, {"kind": kind, **VALID[kind]}, format="json")
        assert Memory.objects.get(pk=response.json()["id"]).text == text


@pytest.mark.parametrize(("kind", "payload", "field"), INVALID)
def test_each_invalid_field_is_named_and_nothing_stored(school: School, url: str, kind: str, payload: dict[str, Any],
                                                       field: str) -> None:
    response = school.agent.post(url, {"kind": kind, **payload}, format="json")
    assert response.status_code == 400, response.json()
    body = response.json()
    assert body["error"]["code"] == "invalid"
    assert field in body["error"]["fields"], body
    assert _stored(school.stack) == 0
    school.stack.refresh_from_db()
    assert school.stack.memory_count == 0


@pytest.mark.parametrize("body", [[1, 2], "text", {"statement": "no kind"}, {"kind": "dream", "content": "x"}])
def test_malformed_bodies_are_400(school: School, url: str, body: Any) -> None:
    response = school.agent.post(url, body, format="json")
    assert response.status_code == 400
    assert _stored(school.stack) == 0


def test_broken_json_is_400(school: School, url: str) -> None:
    response = school.agent.post(url, data="{not json", content_type="application/json")
    assert response.status_code == 400
    assert _stored(school.stack) == 0


def test_absurdly_nested_body_is_400(school: School, url: str) -> None:
    deep = '{"kind": "note", "content": "x", "deep": ' + "[" * 100_000 + "]" * 100_000 + "}"
    response = school.agent.post(url, data=deep, content_type="application/json")
    assert response.status_code == 400
    nested = '{"kind": "note", "content": "x", "deep": ' + "[" * 50 + "]" * 50 + "}"
    response = school.agent.post(url, data=nested, content_type="application/json")
    assert response.status_code == 400
    assert _stored(school.stack) == 0


def test_oversized_memory_is_refused_and_nothing_stored(school: School, url: str) -> None:
    response = school.agent.post(url, {"kind": "note", "content": "x" * 20_001}, format="json")
    assert response.status_code == 400
    assert "content" in response.json()["error"]["fields"]
    huge_extra = {f"k{i}": "y" * 1000 for i in range(100)}
    response = school.agent.post(url, {"kind": "note", "content": "hi", "extra": huge_extra}, format="json")
    assert response.status_code == 413
    big_raw = school.agent.post(url, {"kind": "raw", "blob": "z" * 100_001}, format="json")
    assert big_raw.status_code == 400
    assert _stored(school.stack) == 0


def test_control_characters_removed_and_nulls_accepted(school: School, url: str) -> None:
    response = school.agent.post(url, {
        "kind": "note", "content": "line\x00one\x07\nline two\ttab", "speaker": None, "tags": None,
        "extra": {"weird\x00key": "v\x00al"}, "confidence": None,
    }, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["data"]["content"] == "lineone\nline two\ttab"
    assert body["data"]["speaker"] is None
    assert body["tags"] == []
    assert body["confidence"] == 0.8
    assert body["extra"] == {"weirdkey": "val"}


def test_server_controlled_fields_are_refused_by_name(school: School, url: str) -> None:
    # The native API is strict (kernle sync keeps its leniency: tests/memories/test_sync_kernle.py).
    response = school.agent.post(url, {
        "kind": "belief", "statement": "x", "version": 99, "forgotten_at": "2020-01-01T00:00:00Z",
        "embedding": [0.1], "stack_id": "other", "id": "abc", "deleted": True,
    }, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "unknown_field"
    assert set(error["fields"]) == {"version", "forgotten_at", "embedding", "stack_id", "id", "deleted"}
    assert error["fields"]["id"] == ["Set by the server; it cannot be written. Use `record_id` for your own id."]
    assert _stored(school.stack) == 0


def test_duplicate_record_id_is_409_and_first_kept(school: School, url: str,
                                                  django_capture_on_commit_callbacks: Any) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        first = school.agent.post(url, {"kind": "note", "record_id": "n-1", "content": "first"},
                                  format="json")
        assert first.status_code == 201
        again = school.agent.post(url, {"kind": "note", "record_id": "n-1", "content": "second"},
                                  format="json")
    assert again.status_code == 409
    assert Memory.objects.get(stack=school.stack).data["content"] == "first"
    school.stack.refresh_from_db()
    assert school.stack.memory_count == 1


def test_update_bumps_version_keeps_revision_and_resets_embedding(school: School, url: str) -> None:
    created = school.agent.post(url, {"kind": "belief", **VALID["belief"], "extra": {"custom": 1}},
                                format="json").json()
    memory = Memory.objects.get(pk=created["id"])
    Memory.objects.filter(pk=memory.pk).update(embedded_version=1)
    seq_before = memory.change_seq
    response = school.agent.patch(f"{url}/{created['id']}", {"statement": "Pictures help a lot"},
                                  format="json")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["version"] == 2
    assert body["data"]["statement"] == "Pictures help a lot"
    assert body["confidence"] == 0.9  # untouched fields kept
    assert body["extra"] == {"custom": 1}
    memory.refresh_from_db()
    assert memory.embedded_version is None
    assert memory.change_seq > seq_before
    assert memory.text == "Pictures help a lot"
    revision = MemoryRevision.objects.get(memory=memory)
    assert revision.version == 1
    assert revision.snapshot["data"]["statement"] == VALID["belief"]["statement"]
    # A no-op change keeps the version.
    same = school.agent.patch(f"{url}/{created['id']}", {"statement": "Pictures help a lot"}, format="json")
    assert same.json()["version"] == 2


def test_invalid_update_changes_nothing(school: School, url: str) -> None:
    created = school.agent.post(url, {"kind": "belief", **VALID["belief"]}, format="json").json()
    response = school.agent.patch(f"{url}/{created['id']}", {"confidence": 7}, format="json")
    assert response.status_code == 400
    assert "confidence" in response.json()["error"]["fields"]
    memory = Memory.objects.get(pk=created["id"])
    assert memory.version == 1
    assert memory.confidence == 0.9
    assert not MemoryRevision.objects.exists()


def test_list_filters_and_cursor_pagination(school: School, url: str) -> None:
    client = school.agent
    for i in range(5):
        client.post(url, {"kind": "note", "content": f"note {i}", "tags": ["math"] if i % 2 else ["art"]},
                    format="json")
    client.post(url, {"kind": "belief", "statement": "b", "tags": ["math", "core"]}, format="json")
    assert len(client.get(url).json()["results"]) == 6
    assert {m["kind"] for m in client.get(url, {"kind": "belief"}).json()["results"]} == {"belief"}
    assert len(client.get(url, {"kind": "note,belief"}).json()["results"]) == 6
    assert len(client.get(url, {"tags": "math"}).json()["results"]) == 3
    assert len(client.get(url, {"tags": "math,core"}).json()["results"]) == 1
    page = client.get(url, {"limit": 4}).json()
    assert len(page["results"]) == 4 and page["next"]
    rest = client.get(page["next"]).json()
    assert len(rest["results"]) == 2
    seen = {m["id"] for m in page["results"]} | {m["id"] for m in rest["results"]}
    assert len(seen) == 6
    future = (timezone.now() + timedelta(days=1)).isoformat()
    assert client.get(url, {"created_after": future}).json()["results"] == []
    assert len(client.get(url, {"created_before": future}).json()["results"]) == 6
    bad = client.get(url, {"kind": "dream", "created_after": "soon", "forgotten": "maybe"})
    assert bad.status_code == 400
    assert set(bad.json()["error"]["fields"]) == {"kind", "created_after", "forgotten"}


def test_expired_memories_vanish_from_reads(school: School, url: str) -> None:
    client = school.agent
    past = (timezone.now() - timedelta(seconds=1)).isoformat()
    expired = client.post(url, {"kind": "note", "content": "gone", "expires_at": past}, format="json").json()
    live = client.post(url, {"kind": "note", "content": "here",
                             "expires_at": (timezone.now() + timedelta(days=1)).isoformat()}, format="json").json()
    ids = [m["id"] for m in client.get(url, {"forgotten": "include"}).json()["results"]]
    assert ids == [live["id"]]
    assert client.get(f"{url}/{expired['id']}").status_code == 404


def test_forget_recover_protect_cycle(school: School, url: str) -> None:
    client = school.agent
    note = client.post(url, {"kind": "note", "content": "temporary"}, format="json").json()
    forgotten = client.post(f"{url}/{note['id']}/forget", {"reason": "outdated"}, format="json")
    assert forgotten.status_code == 200
    assert forgotten.json()["forgotten"] is True
    assert forgotten.json()["forgotten_reason"] == "outdated"
    assert forgotten.json()["strength"] == 0.0
    assert client.get(url).json()["results"] == []
    assert [m["id"] for m in client.get(url, {"forgotten": "only"}).json()["results"]] == [note["id"]]
    assert client.post(f"{url}/{note['id']}/forget", {}, format="json").status_code == 409
    recovered = client.post(f"{url}/{note['id']}/recover")
    assert recovered.status_code == 200
    assert recovered.json()["forgotten"] is False
    assert recovered.json()["strength"] == 0.2
    assert recovered.json()["version"] == 3
    assert client.post(f"{url}/{note['id']}/recover").status_code == 409

    protected = client.post(f"{url}/{note['id']}/protect")
    assert protected.json()["is_protected"] is True
    refused = client.post(f"{url}/{note['id']}/forget", {"reason": "x"}, format="json")
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "memory_protected"
    assert Memory.objects.get(pk=note["id"]).forgotten_at is None
    assert client.post(f"{url}/{note['id']}/unprotect").json()["is_protected"] is False
    actions = list(MemoryRevision.objects.filter(memory_id=note["id"]).order_by("id").values_list("action", flat=True))
    assert actions == ["forget", "recover", "protect", "unprotect"]


def test_values_are_protected_by_default(school: School, url: str) -> None:
    value = school.agent.post(url, {"kind": "value", **VALID["value"]}, format="json").json()
    response = school.agent.post(f"{url}/{value['id']}/forget", {"reason": "x"}, format="json")
    assert response.status_code == 409


def test_unknown_memory_is_404(school: School, url: str) -> None:
    assert school.agent.get(f"{url}/00000000-0000-0000-0000-000000000000").status_code == 404
    assert school.agent.get(f"{url}/not-a-uuid").status_code == 404


def test_batch_create_all_or_nothing(school: School, url: str, django_capture_on_commit_callbacks: Any) -> None:
    client, url = school.agent, url + "/batch"
    good = [{"kind": kind, **payload} for kind, payload in VALID.items()]
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(url, {"items": good}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["created"] == len(VALID)
    assert _stored(school.stack) == len(VALID)
    school.stack.refresh_from_db()
    assert school.stack.memory_count == len(VALID)

    bad = [{"kind": "note", "content": "fine"}, {"kind": "belief", "confidence": 3}]
    response = client.post(url, {"items": bad}, format="json")
    assert response.status_code == 400
    fields = response.json()["error"]["fields"]
    assert "items.1.statement" in fields and "items.1.confidence" in fields
    assert _stored(school.stack) == len(VALID)

    assert client.post(url, {"items": []}, format="json").status_code == 400
    assert client.post(url, {"items": "x"}, format="json").status_code == 400
    assert client.post(url, {"items": [{"kind": "note", "content": "x"}] * 501}, format="json").status_code == 413
    dup = [{"kind": "note", "record_id": "a", "content": "1"}, {"kind": "note", "record_id": "a", "content": "2"}]
    assert client.post(url, {"items": dup}, format="json").status_code == 400
    assert _stored(school.stack) == len(VALID)


def test_quota_exceeded_stores_nothing(school: School, url: str) -> None:
    from billing.entitlements import tier_for

    limit = tier_for(school.org).storage_bytes
    if limit is None:
        pytest.skip("the default tier has no storage limit")
    Stack.objects.filter(pk=school.stack.pk).update(bytes_used=limit)
    response = school.agent.post(url, {"kind": "note", "content": "one more"}, format="json")
    assert response.status_code == 402
    assert _stored(school.stack) == 0
