"""The rules the memories API used to decide in its views, now in memories.selectors, seen through
HTTP (what callers get) and called directly; and the request serializers that read every body.

* an expired memory is a 404 to retrieval feedback too, as to every other read;
* only a school key searches across stacks (403 before the body is even read);
* kernle search picks its stack: body `stack_id`, then the key's binding, then the latest push;
* promotion with `auto` is a write (read-only key: 403, archived stack: 409), suggestions are not;
* job runs are for staff and dashboard admins only.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.authentication import principal_for_key
from accounts.models import Membership, User
from memories import selectors
from memories.models import Memory, MemoryRevision
from memories.serializers.memories import MemoryListQuerySerializer
from memories.serializers.records import MemoryWriteSerializer
from memories.serializers.search import KernleSearchInSerializer, SearchInSerializer, SmartIngestInSerializer
from memories.services import memory_create
from memoryhub.errors import Forbidden, InvalidInput, NotFound
from stacks.models import Stack
from tests.actors import School
from tests.factories import bearer_client, make_key, make_stack, make_user, session_client


def _signed_in(user: User) -> APIClient:
    """A dashboard session without the CSRF check (the rule under test, not the browser's token)."""
    client = APIClient()
    client.force_login(user)
    return client


def _note(stack: Stack, content: str = "fractions with pizza diagrams", **fields: Any) -> Memory:
    return memory_create(stack=stack, kind="note", payload={"content": content, **fields}, source="api")


def _expire(memory: Memory) -> None:
    Memory.objects.filter(pk=memory.pk).update(expires_at=timezone.now() - timedelta(seconds=1))


# --- expired memories are gone for feedback too -------------------------------------------------------

def test_feedback_on_an_expired_memory_is_404_and_changes_nothing(school: School) -> None:
    memory = _note(school.stack)
    _expire(memory)
    response = school.agent.post(school.stack_url(f"memories/{memory.pk}/feedback"), {"action": "promote"},
                                 format="json")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "memory_not_found"
    stored = Memory.objects.get(pk=memory.pk)
    assert stored.last_reviewed_at is None and stored.stability == memory.stability
    assert not MemoryRevision.objects.filter(memory=memory, source="feedback").exists()


def test_feedback_on_a_live_memory_still_works(school: School) -> None:
    memory = _note(school.stack)
    response = school.agent.post(school.stack_url(f"memories/{memory.pk}/feedback"), {"action": "promote"},
                                 format="json")
    assert response.status_code == 200, response.content
    assert response.json()["memory_id"] == str(memory.pk)


def test_memory_get_hides_expired_and_treats_a_non_uuid_as_missing(school: School) -> None:
    memory = _note(school.stack)
    assert selectors.memory_get(stack=school.stack, memory_id=str(memory.pk)).pk == memory.pk
    _expire(memory)
    for memory_id in (memory.pk, str(memory.pk), "nope", ""):
        with pytest.raises(NotFound):
            selectors.memory_get(stack=school.stack, memory_id=memory_id)


# --- the school-wide search --------------------------------------------------------------------------

def test_an_agent_key_cannot_search_the_school(school: School) -> None:
    _note(school.stack)
    for client in (school.agent, _signed_in(school.admin), _signed_in(school.teacher)):
        response = client.post("/api/v1/search", {"query": "fractions"}, format="json")
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "school_key_required"
        # Refused before the body is read: a bad body is still a 403, not a 400.
        assert client.post("/api/v1/search", {"query": 5}, format="json").status_code == 403
    assert school.admin_api.post("/api/v1/search", {"query": "fractions"}, format="json").json()["total"] == 1


def test_a_read_only_school_key_may_search_the_school(school: School) -> None:
    _note(school.stack)
    _, secret = make_key(school.org, read_only=True)
    response = bearer_client(secret).post("/api/v1/search", {"query": "fractions"}, format="json")
    assert response.status_code == 200
    assert response.json()["total"] == 1


def test_school_search_selector(school: School) -> None:
    school_key = principal_for_key(school.admin_key)
    agent_key = principal_for_key(school.agent_key)
    with pytest.raises(Forbidden):
        selectors.ensure_may_search_across_stacks(agent_key)
    with pytest.raises(Forbidden):
        selectors.stacks_for_school_search(agent_key, slugs=[])
    assert {s.slug for s in selectors.stacks_for_school_search(school_key, slugs=[])} == {"alice", "bob"}
    assert [s.slug for s in selectors.stacks_for_school_search(school_key, slugs=["bob", "bob"])] == ["bob"]
    with pytest.raises(NotFound):
        selectors.stacks_for_school_search(school_key, slugs=["bob", "nope"])


# --- which stack kernle search searches -----------------------------------------------------------------

def test_kernle_search_stack_choice(school: School) -> None:
    school_key = principal_for_key(school.admin_key)
    with pytest.raises(NotFound, match="No stack to search"):
        selectors.stack_for_kernle_search(school_key, stack_id=None)
    Stack.objects.filter(pk=school.other_stack.pk).update(last_sync_at=timezone.now())
    assert selectors.stack_for_kernle_search(school_key, stack_id=None).slug == "bob"
    assert selectors.stack_for_kernle_search(school_key, stack_id="").slug == "bob"
    assert selectors.stack_for_kernle_search(school_key, stack_id="alice").slug == "alice"
    # A bound key searches its own stack, though another was pushed later, and reaches no other.
    agent_key = principal_for_key(school.agent_key)
    assert selectors.stack_for_kernle_search(agent_key, stack_id=None).slug == "alice"
    with pytest.raises(NotFound):
        selectors.stack_for_kernle_search(agent_key, stack_id="bob")


# --- promotion: suggestions read, auto writes -------------------------------------------------------

def test_promotion_with_auto_is_a_write(school: School) -> None:
    url = school.stack_url("promote")
    _, read_only = make_key(school.org, stack=school.stack, read_only=True)
    reader = bearer_client(read_only)
    assert reader.post(url, {}, format="json").status_code == 200  # suggestions only
    refused = reader.post(url, {"auto": True}, format="json")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "read_only_key"
    archived = make_stack(school.org, "archived-one", status=Stack.Status.ARCHIVED)
    archived_url = f"/api/v1/stacks/{archived.slug}/promote"
    assert school.admin_api.post(archived_url, {}, format="json").status_code == 200
    conflict = school.admin_api.post(archived_url, {"auto": True}, format="json")
    assert conflict.status_code == 409
    assert conflict.json()["error"]["code"] == "stack_archived"
    assert school.agent.post(url, {"auto": True}, format="json").status_code == 200


def test_ensure_may_promote(school: School) -> None:
    read_only_key, _ = make_key(school.org, stack=school.stack, read_only=True)
    principal = principal_for_key(read_only_key)
    selectors.ensure_may_promote(principal, school.stack, auto=False)
    with pytest.raises(Forbidden):
        selectors.ensure_may_promote(principal, school.stack, auto=True)


# --- job runs ------------------------------------------------------------------------------------------

def test_job_runs_are_for_staff_and_school_admins(school: School) -> None:
    assert session_client(school.admin).get("/api/v1/jobs/").status_code == 200
    assert school.admin_api.get("/api/v1/jobs/").status_code == 200  # the school-wide key
    staff = make_user(school.org, role=Membership.Role.TEACHER)
    User.objects.filter(pk=staff.pk).update(is_staff=True)
    staff.refresh_from_db()
    assert session_client(staff).get("/api/v1/jobs/").status_code == 200
    for client in (school.agent, session_client(school.teacher)):
        response = client.get("/api/v1/jobs/")
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "admin_only"


# --- request serializers: the one way input is read ------------------------------------------------

def _errors(serializer_class: Any, data: Any) -> dict[str, Any]:
    serializer = serializer_class(data=data)
    assert not serializer.is_valid()
    return dict(serializer.errors)


def test_search_body_becomes_a_search_query() -> None:
    serializer = SearchInSerializer(data={
        "query": "  fractions ", "limit": 1000, "kinds": ["Notes", "belief", "note"], "tags": [" math ", " "],
        "created_after": "2026-01-01T00:00:00", "min_similarity": -3, "created_before": "",
    })
    assert serializer.is_valid(), serializer.errors
    query = serializer.validated_data["search"]
    assert (query.text, query.limit, query.kinds, query.tags) == ("fractions", 100, ("note", "belief"), ("math",))
    assert query.created_after is not None and query.created_after.utcoffset() == timedelta(0)  # naive is UTC
    assert query.created_before is None
    assert query.min_similarity == 0.0


def test_a_null_option_means_not_given() -> None:
    serializer = SearchInSerializer(data={"query": "x", "limit": None, "kinds": None, "tags": None,
                                          "created_after": None, "min_similarity": None})
    assert serializer.is_valid(), serializer.errors
    query = serializer.validated_data["search"]
    assert (query.limit, query.kinds, query.tags, query.created_after) == (10, (), (), None)
    kernle = KernleSearchInSerializer(data={"query": "x", "memory_types": None, "stack_id": None})
    assert kernle.is_valid(), kernle.errors
    assert kernle.validated_data["search"].kinds == ("episode", "note", "belief", "value", "goal")
    assert kernle.validated_data.get("stack_id") is None


@pytest.mark.parametrize(("body", "field"), [
    ({"query": 5}, "query"), ({"query": "x", "limit": True}, "limit"), ({"query": "x", "limit": "5.5"}, "limit"),
    ({"query": "x", "min_similarity": "nan"}, "min_similarity"), ({"query": "x", "tags": "math"}, "tags"),
    ({"query": "x", "tags": ["t"] * 51}, "tags"), ({"query": "x", "created_after": 5}, "created_after"),
])
def test_search_fields_are_strict(body: dict[str, Any], field: str) -> None:
    assert field in _errors(SearchInSerializer, body)


def test_ingest_fields_are_strict() -> None:
    base = {"kind": "note", "data": {"content": "x"}}
    assert "force_create" in _errors(SmartIngestInSerializer, {**base, "force_create": "yes"})
    assert "supersedes" in _errors(SmartIngestInSerializer, {**base, "supersedes": 5})
    with pytest.raises(InvalidInput) as raised:  # smart ingest's own rule, keyed by threshold
        SmartIngestInSerializer(data={**base, "thresholds": {"update": "high"}}).is_valid()
    assert "thresholds.update" in raised.value.fields


def test_a_memory_body_keeps_its_record_for_the_schema() -> None:
    serializer = MemoryWriteSerializer(data={"kind": "belief", "record_id": " b\x07-1 ", "statement": "s",
                                             "extra": {"custom": {"x": 1}}})
    assert serializer.is_valid(), serializer.errors
    assert serializer.validated_data == {"kind": "belief", "record_id": "b-1",
                                         "record": {"statement": "s", "custom": {"x": 1}}}
    assert "non_field_errors" in _errors(MemoryWriteSerializer, ["kind", "belief"])
    assert "record_id" in _errors(MemoryWriteSerializer, {"kind": "note", "record_id": 7})


def test_list_filters_read_commas_and_repeats() -> None:
    from django.http import QueryDict

    serializer = MemoryListQuerySerializer(data=QueryDict("kind=note,belief&kind=goal&tags=a,,b&created_after="))
    assert serializer.is_valid(), serializer.errors
    assert serializer.validated_data["kind"] == ["note", "belief", "goal"]
    assert serializer.validated_data["tags"] == ["a", "b"]
    assert serializer.validated_data["forgotten"] == "exclude"
    assert "created_after" not in serializer.validated_data


def test_the_create_body_is_still_checked_field_by_field(school: School) -> None:
    url = school.stack_url("memories")
    response = school.agent.post(url, {"kind": "belief", "confidence": 3}, format="json")
    assert response.status_code == 400
    assert {"statement", "confidence"} <= set(response.json()["error"]["fields"])
    response = school.agent.post(url, {"kind": "note", "record_id": "n\x00-1", "content": "hi"}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["record_id"] == "n-1"  # control characters removed, as from every stored string
