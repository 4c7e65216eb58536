"""The native API refuses fields a memory kind does not have, naming each and suggesting the closest
known one; kernle sync keeps its documented leniency (unknown fields kept in `extra`,
docs/kernle-protocol.md §3.7). Smart ingest takes the body of a memory create.
"""

from __future__ import annotations

from typing import Any

import pytest

from memories.models import Memory
from memories.records.fields import kind_fields, native_record
from memories.records.normalize import normalize_memory
from memories.records.vocabulary import KINDS
from memoryhub.errors import InvalidInput
from tests.actors import School

pytestmark = pytest.mark.django_db

MEMORIES = "/api/v1/stacks/alice/memories"
INGEST = "/api/v1/stacks/alice/ingest"


def _error(response: Any) -> dict[str, Any]:
    assert response.status_code == 400, response.content
    return response.json()["error"]


def test_a_typo_is_a_400_naming_the_field_and_the_closest_known_one(school: School) -> None:
    response = school.agent.post(MEMORIES, {"kind": "goal", "title": "Master fractions", "priorty": "high"},
                                 format="json")
    assert response.json() == {
        "error": {"code": "unknown_field", "message": "The memory has fields its kind does not know.",
                  "fields": {"priorty": ["Unknown field. Did you mean 'priority'?"]}},
        "detail": "The memory has fields its kind does not know."}
    assert not Memory.objects.exists()


def test_every_unknown_key_is_named_at_once_with_what_to_do(school: School) -> None:
    error = _error(school.agent.post(MEMORIES, {
        "kind": "note", "content": "Pizza diagrams", "statment": "x", "mood": "happy", "text": "t", "id": "n1",
        "tag": ["math"]}, format="json"))
    assert error["code"] == "unknown_field"
    assert error["fields"] == {
        "statment": ["Unknown field for a note; fields a kind does not model go under `extra`."],
        "mood": ["Unknown field for a note; fields a kind does not model go under `extra`."],
        "text": ["Set by the server; it cannot be written. Did you mean 'content'?"],
        "id": ["Set by the server; it cannot be written. Use `record_id` for your own id."],
        "tag": ["Unknown field. Did you mean 'tags'?"],
    }
    assert not Memory.objects.exists()


def test_fields_of_your_own_go_under_extra_and_come_back(school: School) -> None:
    created = school.agent.post(MEMORIES, {"kind": "note", "content": "Pizza diagrams",
                                           "extra": {"mood": "happy", "lesson_plan": {"week": 3}}}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["extra"] == {"mood": "happy", "lesson_plan": {"week": 3}}
    assert created.json()["data"]["content"] == "Pizza diagrams"
    memory_url = f"{MEMORIES}/{created.json()['id']}"
    patched = school.agent.patch(memory_url, {"extra": {"mood": "calm"}}, format="json")
    assert patched.status_code == 200, patched.content
    assert patched.json()["extra"] == {"mood": "calm", "lesson_plan": {"week": 3}}

    bad = _error(school.agent.post(MEMORIES, {"kind": "note", "content": "x",
                                              "extra": {"content": "y", "version": 3}}, format="json"))
    assert bad["fields"] == {"extra.content": ["A field of a note; send it at the top level."],
                             "extra.version": ["A reserved name; it cannot be kept in extra."]}
    assert _error(school.agent.post(MEMORIES, {"kind": "note", "content": "x", "extra": ["no"]},
                                    format="json"))["fields"] == {"extra": ["Must be an object."]}
    assert Memory.objects.count() == 1


def test_an_update_is_checked_against_the_memorys_own_kind(school: School) -> None:
    belief = school.agent.post(MEMORIES, {"kind": "belief", "statement": "Pictures help"}, format="json").json()
    error = _error(school.agent.patch(f"{MEMORIES}/{belief['id']}", {"statment": "Pictures help a lot"},
                                      format="json"))
    assert error == {"code": "unknown_field", "message": "The memory has fields its kind does not know.",
                     "fields": {"statment": ["Unknown field. Did you mean 'statement'?"]}}
    # A note's field is no belief's.
    assert "content" in _error(school.agent.patch(f"{MEMORIES}/{belief['id']}", {"content": "x"},
                                                  format="json"))["fields"]
    assert Memory.objects.get(pk=belief["id"]).version == 1


def test_a_batch_names_the_unknown_fields_of_every_item_and_stores_nothing(school: School) -> None:
    error = _error(school.agent.post(f"{MEMORIES}/batch", {"items": [
        {"kind": "note", "content": "fine"},
        {"kind": "goal", "title": "Fractions", "priorty": "high"},
        {"kind": "value", "name": "curiosity", "statement": "Ask why", "priority": 80, "colour": "blue"},
    ]}, format="json"))
    assert error["code"] == "unknown_field"
    assert error["fields"] == {
        "items.1.priorty": ["Unknown field. Did you mean 'priority'?"],
        "items.2.colour": ["Unknown field for a value; fields a kind does not model go under `extra`."]}
    assert not Memory.objects.exists()
    ok = school.agent.post(f"{MEMORIES}/batch", {"items": [
        {"kind": "note", "record_id": "n-1", "content": "fine", "extra": {"mood": "ok"}}]}, format="json")
    assert ok.status_code == 201, ok.content
    assert ok.json()["memories"][0]["extra"] == {"mood": "ok"}
    assert ok.json()["memories"][0]["record_id"] == "n-1"


def test_smart_ingest_takes_the_body_of_a_memory_create(school: School) -> None:
    created = school.agent.post(INGEST, {"kind": "note", "content": "Fractions click with pizza diagrams",
                                         "tags": ["math"], "extra": {"mood": "happy"}, "force_create": True},
                                format="json")
    assert created.status_code == 201, created.content
    assert created.json()["decision"] == "create" and "Deprecation" not in created
    stored = Memory.objects.get(pk=created.json()["memory"]["id"])
    assert stored.tags == ["math"] and stored.extra == {"mood": "happy"}
    error = _error(school.agent.post(INGEST, {"kind": "note", "contnet": "typo"}, format="json"))
    assert error["fields"] == {"contnet": ["Unknown field. Did you mean 'content'?"]}
    assert Memory.objects.count() == 1


def test_smart_ingest_still_reads_the_deprecated_nested_body_and_says_so(school: School) -> None:
    old = school.agent.post(INGEST, {"kind": "note", "data": {"content": "Paper strips help too"}}, format="json")
    assert old.status_code == 201, old.content
    assert old["Deprecation"] == "true"
    assert Memory.objects.get().data["content"] == "Paper strips help too"
    both = _error(school.agent.post(INGEST, {"kind": "note", "content": "a", "data": {"content": "b"}},
                                    format="json"))
    assert list(both["fields"]) == ["data"]
    nested_typo = _error(school.agent.post(INGEST, {"kind": "note", "data": {"contnet": "b"}}, format="json"))
    assert nested_typo["code"] == "unknown_field"
    assert Memory.objects.count() == 1


def test_kernle_sync_keeps_unknown_fields_in_extra(school: School) -> None:
    """The same kind of typo through the kernle sync protocol: stored, the unknown field kept."""
    response = school.agent.post("/sync/push", {"stack_id": "alice", "operations": [{
        "operation": "update", "table": "goals", "record_id": "g-1", "version": 1,
        "data": {"title": "Master fractions", "priorty": "high"}}]}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["synced"] == 1
    assert Memory.objects.get(record_id="g-1").extra == {"priorty": "high"}


# --- the field list the strictness and the OpenAPI document are built from -----------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_the_recorded_field_list_is_exactly_what_the_schema_reads(kind: str) -> None:
    fields = kind_fields(kind)
    # Every recorded field is one the schema reads: given them all, nothing is left over for `extra`.
    required = {"raw": {"content": "c"}, "episode": {"objective": "o", "outcome": "x"}, "note": {"content": "c"},
                "belief": {"statement": "s"}, "value": {"name": "n", "statement": "s"}, "goal": {"title": "t"},
                "drive": {"drive_type": "d"}, "relationship": {"entity_name": "e"},
                "playbook": {"name": "n", "description": "d"}}[kind]
    payload: dict[str, Any] = dict.fromkeys(fields.names)
    payload.update(required)
    normalized = normalize_memory(kind, payload)
    assert normalized.extra == {}
    # Every field the schema stores is in the list (client_updated_at is read as local_updated_at).
    stored = set(normalized.data) | set(normalized.columns) - {"client_updated_at"}
    assert stored <= fields.names
    # Required: the fields given above (a raw entry needs content *or* blob: a group, not a required field).
    assert {spec.name for spec in fields.fields if spec.required} == (set() if kind == "raw" else set(required))
    assert fields.one_of_required == ((("content", "blob"),) if kind == "raw" else ())
    native_record(kind, payload)  # the native API accepts the whole list


def test_native_record_ignores_kinds_it_does_not_know() -> None:
    assert native_record("dragon", {"anything": 1}) == {"anything": 1}  # normalize_memory names the kind
    with pytest.raises(InvalidInput) as raised:
        native_record("note", {"contents": "x"}, prefix="items.4.")
    assert raised.value.code == "unknown_field"
    assert raised.value.fields == {"items.4.contents": ["Unknown field. Did you mean 'content'?"]}


def test_a_time_offset_postgres_cannot_hold_is_read_in_utc_not_a_database_error(school: School) -> None:
    """Python reads offsets up to ±23:59, PostgreSQL only ±15:59: found by the schema fuzzer once the
    per-kind schemas documented `expires_at` as a date-time."""
    created = school.agent.post(MEMORIES, {"kind": "note", "content": "x", "expires_at": "2030-01-01T00:00:00-23:59"},
                                format="json")
    assert created.status_code == 201, created.content
    assert created.json()["expires_at"] == "2030-01-01T23:59:00Z"
    listed = school.agent.get(MEMORIES, {"created_after": "1970-01-01T00:00:00-23:59"})
    assert listed.status_code == 200 and len(listed.json()["results"]) == 1
    early = _error(school.agent.post(MEMORIES, {"kind": "note", "content": "y",
                                                "expires_at": "0001-01-01T00:00:00+14:00"}, format="json"))
    assert list(early["fields"]) == ["expires_at"]
    assert Memory.objects.count() == 1
