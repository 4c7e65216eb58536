"""Lifecycle API: forgetting candidates, recall, job runs — including who may not reach them."""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import Membership
from memories.lifecycle.decay_pass import decay_pass
from memories.lifecycle.ttl import ttl_purge
from memories.models import JobRun, Memory, MemoryRevision
from stacks.models import Stack
from tests.factories import assign_teacher, bearer_client, make_key, make_org, make_stack, make_user, session_client

pytestmark = pytest.mark.django_db
_ids = itertools.count(1)


def make_memory(stack: Stack, kind: str = "episode", *, days_old: float = 0.0, **fields: Any) -> Memory:
    created = timezone.now() - timedelta(days=days_old)
    n = next(_ids)
    return Memory.objects.create(stack=stack, kind=kind, record_id=f"api-{n}", text=f"lesson number {n} " * 30,
                                 created_at=created, server_updated_at=created, **fields)


def plain_session(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


@pytest.fixture(autouse=True)
def fast_passwords(settings: Any) -> None:
    # The fixture below creates several people; password hashing strength is not under test here.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def world() -> dict[str, Any]:
    org = make_org()
    owner = make_user(org)
    stack = make_stack(org, "student-a")
    sibling = make_stack(org, "student-b")
    _, agent_secret = make_key(org, stack=stack, user=owner)
    _, read_only_secret = make_key(org, stack=stack, read_only=True, user=owner)
    _, sibling_secret = make_key(org, stack=sibling, user=owner)
    _, school_secret = make_key(org, user=owner)
    foreign_org = make_org()
    make_stack(foreign_org, "student-a")  # same slug in another school
    _, foreign_secret = make_key(foreign_org)
    assigned = make_user(org, role=Membership.Role.TEACHER)
    assign_teacher(assigned, stack)
    return {
        "org": org, "stack": stack, "sibling": sibling,
        "agent": bearer_client(agent_secret), "read_only": bearer_client(read_only_secret),
        "sibling_key": bearer_client(sibling_secret), "school_key": bearer_client(school_secret),
        "foreign": bearer_client(foreign_secret),
        "admin": session_client(owner),
        "teacher": plain_session(assigned),
        "other_teacher": plain_session(make_user(org, role=Membership.Role.TEACHER)),
    }


CANDIDATES = "/api/v1/stacks/student-a/forgetting-candidates"


def test_forgetting_candidates_list_what_would_fade(world):
    stack = world["stack"]
    faded = make_memory(stack, days_old=200)
    make_memory(stack, days_old=1)
    make_memory(stack, days_old=300, is_protected=True)
    soon = make_memory(stack, days_old=140)
    for who in ("agent", "read_only", "school_key", "admin", "teacher"):
        response = world[who].get(CANDIDATES)
        assert response.status_code == 200, (who, response.content)
        body = response.json()
        assert [c["id"] for c in body["candidates"]] == [str(faded.pk)]
        assert body["threshold"] == 0.05 and body["stack"] == "student-a"
        candidate = body["candidates"][0]
        assert candidate["salience"] < 0.05 and 0 < candidate["retrievability"] < 1
        assert len(candidate["preview"]) == 200
    forecast = (timezone.now() + timedelta(days=30)).isoformat()
    body = world["agent"].get(CANDIDATES, {"as_of": forecast}).json()
    assert [c["id"] for c in body["candidates"]] == [str(faded.pk), str(soon.pk)]
    assert len(world["agent"].get(CANDIDATES, {"as_of": forecast, "limit": 1}).json()["candidates"]) == 1


@pytest.mark.parametrize("who", ["sibling_key", "other_teacher"])
def test_forgetting_candidates_are_invisible_to_outsiders(world, who):
    make_memory(world["stack"], days_old=200)
    response = world[who].get(CANDIDATES)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "stack_not_found"


def test_another_school_with_the_same_slug_sees_only_its_own_stack(world):
    make_memory(world["stack"], days_old=200)
    response = world["foreign"].get(CANDIDATES)
    assert response.status_code == 200
    assert response.json()["candidates"] == []
    assert world["foreign"].get("/api/v1/stacks/student-b/forgetting-candidates").status_code == 404


@pytest.mark.parametrize("query", [{"limit": 0}, {"limit": "many"}, {"as_of": "yesterday"},
                                   {"as_of": "1999-01-01T00:00:00Z"}, {"as_of": "2999-01-01T00:00:00Z"}])
def test_forgetting_candidates_reject_bad_queries(world, query):
    response = world["agent"].get(CANDIDATES, query)
    assert response.status_code == 400
    assert response.json()["error"]["fields"]


def recall_url(memory: Memory, slug: str = "student-a") -> str:
    return f"/api/v1/stacks/{slug}/memories/{memory.pk}/recall"


def test_recall_restores_a_faded_memory(world):
    memory = make_memory(world["stack"], days_old=300)
    decay_pass()
    assert Memory.objects.get(pk=memory.pk).forgotten_reason == "salience_decay"

    response = world["agent"].post(recall_url(memory), {}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["recovered"] is True and body["grade"] == "good"
    assert body["stability"] > 14 and body["next_review_in_days"] >= 14
    stored = Memory.objects.get(pk=memory.pk)
    assert stored.forgotten_at is None and stored.last_reviewed_at is not None
    assert stored.stability == pytest.approx(body["stability"])

    again = world["teacher"].post(recall_url(memory), {"grade": "easy"}, format="json")
    assert again.status_code == 200 and again.json()["recovered"] is False
    assert world["school_key"].post(recall_url(memory), {"grade": 2}, format="json").status_code == 200


@pytest.mark.parametrize(("who", "status"), [("read_only", 403), ("sibling_key", 404), ("foreign", 404),
                                             ("other_teacher", 404)])
def test_recall_by_outsiders_or_read_only_keys_stores_nothing(world, who, status):
    memory = make_memory(world["stack"], days_old=300)
    decay_pass()
    before = Memory.objects.get(pk=memory.pk)
    response = world[who].post(recall_url(memory), {"grade": "good"}, format="json")
    assert response.status_code == status
    after = Memory.objects.get(pk=memory.pk)
    assert (after.forgotten_at, after.stability, after.last_reviewed_at, after.version) == (
        before.forgotten_at, before.stability, before.last_reviewed_at, before.version)
    assert not MemoryRevision.objects.filter(memory=memory, action="recover").exists()


def test_recall_of_a_memory_in_another_stack_is_not_found(world):
    theirs = make_memory(world["sibling"])
    response = world["school_key"].post(recall_url(theirs), {}, format="json")
    assert response.status_code == 404
    assert Memory.objects.get(pk=theirs.pk).last_reviewed_at is None


@pytest.mark.parametrize("body", [{"grade": "great"}, {"grade": 5}, {"grade": None}, ["good"], "good"])
def test_recall_rejects_bad_input_and_stores_nothing(world, body):
    memory = make_memory(world["stack"])
    response = world["agent"].post(recall_url(memory), body, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["code"]
    assert Memory.objects.get(pk=memory.pk).last_reviewed_at is None


def test_recall_of_a_deliberately_forgotten_memory_is_a_conflict(world):
    memory = make_memory(world["stack"], forgotten_at=timezone.now(), forgotten_reason="manual")
    response = world["agent"].post(recall_url(memory), {}, format="json")
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "memory_forgotten"
    assert Memory.objects.get(pk=memory.pk).forgotten_at is not None


def test_job_runs_are_for_admins(world):
    decay_pass()
    ttl_purge()
    response = world["admin"].get("/api/v1/jobs/")
    assert response.status_code == 200
    runs = response.json()
    assert [r["name"] for r in runs] == ["ttl_purge", "decay"]
    # A school admin sees the school's share (tests/memories/test_job_runs_per_school.py), not the totals.
    assert runs[1]["status"] == "succeeded" and runs[1]["scope"] == "organization"
    assert runs[1]["counts"] == {"forgotten": 0}
    assert runs[1]["duration_ms"] is not None
    only_decay = world["admin"].get("/api/v1/jobs/", {"name": "decay"}).json()
    assert [r["name"] for r in only_decay] == ["decay"]
    assert world["admin"].get("/api/v1/jobs/", {"name": "nope"}).status_code == 400
    assert world["school_key"].get("/api/v1/jobs/").json() == runs  # a school-wide key sees what the admin sees
    for who in ("agent", "read_only", "teacher"):
        response = world[who].get("/api/v1/jobs/")
        assert response.status_code == 403, who
        assert response.json()["error"]["code"] == "admin_only"
    assert APIClient().get("/api/v1/jobs/").status_code == 401
    assert JobRun.objects.count() == 2


def test_a_decayed_memory_leaves_search_load_and_pull_and_comes_back_on_recall(world):
    from memories.services import memory_create

    stack = world["stack"]
    created = (timezone.now() - timedelta(days=300)).isoformat()
    faded = memory_create(stack=stack, kind="note", source="api",
                          payload={"content": "Photosynthesis needs sunlight", "created_at": created})
    fresh = memory_create(stack=stack, kind="note", source="api", payload={"content": "Photosynthesis makes sugar"})
    decay_pass()
    assert Memory.objects.get(pk=faded.pk).forgotten_reason == "salience_decay"
    assert Memory.objects.get(pk=fresh.pk).forgotten_at is None
    client = world["agent"]

    def visible() -> dict[str, set[str]]:
        search = client.post("/api/v1/stacks/student-a/search", {"query": "photosynthesis"}, format="json")
        load = client.get("/api/v1/stacks/student-a/load")
        pull = client.get("/api/v1/stacks/student-a/sync/pull")
        assert (search.status_code, load.status_code, pull.status_code) == (200, 200, 200)
        pulled = {str(c.get("id") or c.get("memory_id")) for c in pull.json()["changes"]
                  if not c.get("deleted") and not c.get("forgotten") and not (c.get("data") or {}).get("forgotten_at")}
        return {
            "search": {str(r["id"]) for r in search.json()["results"]},
            "load": {str(m["id"]) for m in load.json()["memories"]},
            "pull": pulled,
        }

    before = visible()
    for path in ("search", "load", "pull"):
        assert str(faded.pk) not in before[path], path
        assert str(fresh.pk) in before[path], path

    assert client.post(recall_url(faded), {"grade": "good"}, format="json").json()["recovered"] is True
    after = visible()
    for path in ("search", "load", "pull"):
        assert str(faded.pk) in after[path], path
