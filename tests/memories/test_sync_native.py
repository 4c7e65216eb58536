"""Native sync: batches of operations with per-operation results, and pull by opaque cursor."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from accounts.models import Organization
from accounts.throttles import throttle_state_clear
from memories.models import Memory
from stacks.models import Stack
from tests.factories import assign_teacher, bearer_client, make_key, make_org, make_stack, make_user, session_client

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_throttles() -> Iterator[None]:
    """Every request here comes from 127.0.0.1: start each test with a full per-IP budget."""
    throttle_state_clear()
    yield


def note(record_id: str, content: str = "Fractions need common denominators", **extra: Any) -> dict[str, Any]:
    return {"op": "upsert", "kind": "note", "record_id": record_id,
            "updated_at": extra.pop("updated_at", "2026-11-21T23:00:00+00:00"),
            "data": {"content": content, "tags": ["math"], **extra}}


@pytest.fixture
def school() -> dict[str, Any]:
    org = make_org()
    org.tier = "enterprise"
    org.save()
    stack = make_stack(org, "student-1")
    _, secret = make_key(org, stack=stack)
    return {"org": org, "stack": stack, "client": bearer_client(secret)}


def push_url(stack: str) -> str:
    return f"/api/v1/stacks/{stack}/sync/push"


def pull_url(stack: str) -> str:
    return f"/api/v1/stacks/{stack}/sync/pull"


def test_push_returns_one_result_per_operation_in_order(school: dict[str, Any]) -> None:
    ops = [note("n1"), {"op": "upsert", "kind": "nope", "record_id": "x"}, note("n2", content=""),
           {"op": "delete", "kind": "note", "record_id": "never-seen"}, note("n3")]
    response = school["client"].post(push_url("student-1"), {"operations": ops}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert [r["status"] for r in body["results"]] == ["applied", "rejected", "rejected", "applied", "applied"]
    assert body["applied"] == 3 and body["rejected"] == 2
    assert body["results"][1]["error"]["code"] == "unsupported_kind"
    assert "content" in body["results"][2]["error"]["fields"]
    assert body["results"][0]["version"] == 1
    assert sorted(Memory.objects.values_list("record_id", flat=True)) == ["n1", "n3"]
    # Re-sending the same batch: same results, same state.
    again = school["client"].post(push_url("student-1"), {"operations": ops}, format="json").json()
    assert again["results"] == body["results"]
    assert Memory.objects.get(record_id="n1").version == 1


def test_push_limits(school: dict[str, Any]) -> None:
    client = school["client"]
    too_many = client.post(push_url("student-1"), {"operations": [note(f"n{i}") for i in range(1001)]},
                           format="json")
    assert too_many.status_code == 413
    assert too_many.json()["error"]["code"] == "too_many_operations"  # the kernle push's rule
    assert too_many.json()["error"]["fields"]["max_operations"] == 1000
    assert client.post(push_url("student-1"), {"operations": "x"}, format="json").status_code == 400
    assert client.post(push_url("student-1"), [1, 2], format="json").status_code == 400
    assert Memory.objects.count() == 0
    full = client.post(push_url("student-1"), {"operations": [note(f"n{i}") for i in range(1000)]}, format="json")
    assert full.status_code == 200 and full.json()["applied"] == 1000
    assert Stack.objects.get(pk=school["stack"].pk).memory_count == 1000


def test_over_the_storage_quota_the_whole_push_is_refused(school: dict[str, Any]) -> None:
    org: Organization = school["org"]
    org.tier = "free"
    org.save()
    Stack.objects.filter(pk=school["stack"].pk).update(bytes_used=10 * 1024 * 1024 - 50)
    response = school["client"].post(push_url("student-1"), {"operations": [note("n1"), note("n2")]},
                                     format="json")
    assert response.status_code == 402
    error = response.json()["error"]
    assert error["code"] == "storage_quota_exceeded" and error["fields"]["limit"] == "storage_bytes"
    assert "10 MB" in error["message"]
    assert Memory.objects.count() == 0


def test_pull_pages_by_cursor_and_resumes_exactly(school: dict[str, Any]) -> None:
    client = school["client"]
    client.post(push_url("student-1"), {"operations": [note(f"n{i:02}") for i in range(25)]}, format="json")
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params = {"limit": 10, **({"cursor": cursor} if cursor else {})}
        body = client.get(pull_url("student-1"), params).json()
        pages += 1
        seen += [c["record_id"] for c in body["changes"]]
        cursor = body["next_cursor"]
        if not body["has_more"]:
            break
    assert pages == 3 and seen == [f"n{i:02}" for i in range(25)]
    # Nothing new: the same cursor gives an empty page and itself back.
    empty = client.get(pull_url("student-1"), {"cursor": cursor}).json()
    assert empty == {"changes": [], "next_cursor": cursor, "has_more": False}
    # Changes after the cursor: an update, a delete (as a tombstone) and a new memory.
    client.post(push_url("student-1"), {"operations": [
        note("n03", content="Edited", updated_at="2026-11-22T00:00:00+00:00"),
        {"op": "delete", "kind": "note", "record_id": "n04"}, note("n99")]}, format="json")
    body = client.get(pull_url("student-1"), {"cursor": cursor}).json()
    changes = {c["record_id"]: c for c in body["changes"]}
    assert sorted(changes) == ["n03", "n04", "n99"]  # one commit: their order among themselves is free
    assert changes["n03"]["data"]["content"] == "Edited" and changes["n03"]["version"] == 2
    assert changes["n04"]["op"] == "delete" and changes["n04"]["data"] == {}


def test_invalid_cursor_and_limit_are_400(school: dict[str, Any]) -> None:
    client = school["client"]
    # "foo:1"; "c1:+5" and "c1: 5" (int() would read them); padding and characters out of the alphabet.
    for cursor in ("garbage!!", "Zm9vOjE", "YzE6KzU", "YzE6IDU", "YzE6NQ==x", "YzE6N*Q"):
        response = client.get(pull_url("student-1"), {"cursor": cursor})
        assert response.status_code == 400, cursor
        assert response.json()["error"]["code"] == "invalid_cursor" and "cursor" in response.json()["error"]["fields"]
    assert client.get(pull_url("student-1"), {"cursor": "YzE6NQ"}).status_code == 200  # "c1:5", as issued
    assert client.get(pull_url("student-1"), {"limit": "ten"}).status_code == 400


class TestIsolation:
    def test_other_school_bound_key_teacher_and_read_only_key(self, school: dict[str, Any]) -> None:
        org = school["org"]
        school["client"].post(push_url("student-1"), {"operations": [note("n1")]}, format="json")
        other_stack = make_stack(org, "student-2")
        other_school = make_org()
        make_stack(other_school, "student-1")
        outsiders = {
            "other school key": bearer_client(make_key(other_school)[1]),
            "key bound to another stack": bearer_client(make_key(org, stack=other_stack)[1]),
        }
        teacher = make_user(org, role="teacher")
        assign_teacher(teacher, other_stack)
        teacher_client = session_client(teacher)
        teacher_client.cookies["csrftoken"] = "a" * 32  # a real CSRF pair: the 404 below is ours, not CSRF's
        outsiders["unassigned teacher"] = teacher_client
        for name, client in outsiders.items():
            if name == "other school key":
                # Same slug, other school: it reaches its own (empty) stack, never this one.
                assert client.get(pull_url("student-1")).json()["changes"] == [], name
                continue
            assert client.get(pull_url("student-1")).status_code == 404, name
            response = client.post(push_url("student-1"), {"operations": [note("evil")]}, format="json",
                                   HTTP_X_CSRFTOKEN="a" * 32)
            assert response.status_code == 404, (name, response.content)
        assert not Memory.objects.filter(record_id="evil").exists()
        read_only = bearer_client(make_key(org, stack=school["stack"], read_only=True)[1])
        assert read_only.post(push_url("student-1"), {"operations": [note("ro")]}, format="json").status_code == 403
        assert read_only.get(pull_url("student-1")).status_code == 200
        assert not Memory.objects.filter(record_id="ro").exists()


def test_two_operations_on_one_record_in_a_batch_apply_in_order_by_timestamp(school: dict[str, Any]) -> None:
    ops = [note("n1", content="newer", updated_at="2026-11-21T23:10:00+00:00", tags=["x"]),
           note("n1", content="older", updated_at="2026-11-21T23:05:00+00:00", tags=["y"]),
           note("n2", content="first"), {"op": "delete", "kind": "note", "record_id": "n2"}]
    body = school["client"].post(push_url("student-1"), {"operations": ops}, format="json").json()
    assert [r["status"] for r in body["results"]] == ["applied"] * 4
    n1 = Memory.objects.get(record_id="n1")
    assert n1.data["content"] == "newer" and set(n1.tags) == {"x", "y"} and n1.version == 1
    assert Memory.objects.get(record_id="n2").deleted_at is not None
    assert Stack.objects.get(pk=school["stack"].pk).memory_count == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_pushes_and_a_paging_reader_miss_nothing() -> None:
    """Pushes to one stack run concurrently with a reader paging by cursor: every push lands, the
    counters add up, and the reader (resuming from each next_cursor) sees every record exactly once."""
    import threading

    from django.db import connection

    org = make_org()
    org.tier = "enterprise"
    org.save()
    make_stack(org, "student-1")
    _, secret = make_key(org)
    writers, per_writer = 4, 60
    errors: list[str] = []
    done = threading.Event()
    seen: list[str] = []

    def writer(n: int) -> None:
        try:
            client = bearer_client(secret)
            for chunk in range(0, per_writer, 20):
                ops = [note(f"w{n}-{i}") for i in range(chunk, chunk + 20)]
                response = client.post(push_url("student-1"), {"operations": ops}, format="json")
                if response.status_code != 200:
                    errors.append(f"push {response.status_code}")
        finally:
            connection.close()

    def reader() -> None:
        try:
            client = bearer_client(secret)
            cursor = None
            while True:
                finished = done.is_set()
                body = client.get(pull_url("student-1"), {"limit": 7, **({"cursor": cursor} if cursor else {})}).json()
                seen.extend(c["record_id"] for c in body["changes"])
                cursor = body["next_cursor"]
                if finished and not body["has_more"]:
                    break
        finally:
            connection.close()

    throttle_state_clear()
    threads = [threading.Thread(target=writer, args=(n,)) for n in range(writers)]
    read_thread = threading.Thread(target=reader)
    read_thread.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    read_thread.join(timeout=60)
    assert errors == []
    expected = sorted(f"w{n}-{i}" for n in range(writers) for i in range(per_writer))
    assert sorted(Memory.objects.values_list("record_id", flat=True)) == expected
    assert Stack.objects.get(slug="student-1").memory_count == writers * per_writer
    assert sorted(seen) == expected  # each record exactly once, none skipped
