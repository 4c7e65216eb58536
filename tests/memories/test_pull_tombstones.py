"""Server-side changes reach devices (docs/api.md "Native sync", docs/kernle-protocol.md §4.6).

A memory forgotten on the dashboard, one purged by its TTL and one erased reach a second native
device's pull as tombstones with ids only, in change order; a recovered one comes back with its
record. A kernle device cannot apply a tombstone, so its pull simply leaves them out, and its
re-push of its old copies brings nothing back. Another stack's removals never show.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from memories.changes.publish import events_prune, events_relay
from memories.lifecycle.ttl import ttl_purge
from memories.models import Memory
from tests.actors import School, school_cast

# Committed transactions, as in production: each write records its own change event.
pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "Ada-told-the-tutor-about-her-dog"


def _push(school: School, slug: str, record_ids: list[str]) -> None:
    ops = [{"op": "upsert", "kind": "note", "record_id": rid, "updated_at": "2026-11-21T23:00:00+00:00",
            "data": {"content": f"{SECRET} {rid}", "tags": ["math"]}} for rid in record_ids]
    response = school.admin_api.post(f"/api/v1/stacks/{slug}/sync/push", {"operations": ops}, format="json")
    assert response.status_code == 200 and response.json()["applied"] == len(ops), response.content


def _pull(client: Any, slug: str, cursor: str | None = None, limit: int = 500) -> dict[str, Any]:
    params: dict[str, Any] = {"limit": limit, **({"cursor": cursor} if cursor else {})}
    response = client.get(f"/api/v1/stacks/{slug}/sync/pull", params)
    assert response.status_code == 200, response.content
    body: dict[str, Any] = response.json()
    return body


def _kernle_op(record_id: str) -> dict[str, Any]:
    return {"operation": "update", "table": "notes", "record_id": record_id, "local_updated_at": None, "version": 1,
            "data": {"id": record_id, "content": f"{SECRET} {record_id} (old copy)", "note_type": "note",
                     "created_at": None, "local_updated_at": None, "strength": 1.0}}


def _forget_on_dashboard(school: School, memory: Memory) -> None:
    staff = Client()
    staff.force_login(school.admin)
    url = reverse("dashboard:memory-action", args=[memory.stack.slug, memory.pk, "forget"])
    assert staff.post(url, {"reason": "parent asked"}).status_code == 302


def _erase(school: School, memory: Memory) -> None:
    response = school.admin_api.post(school.stack_url(f"memories/{memory.pk}/erase"),
                                     {"requested_by": "student, email 2026-11-20"}, format="json")
    assert response.status_code == 200, response.content


def _purge_by_ttl(memory: Memory) -> None:
    Memory.objects.filter(pk=memory.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    # A stack another writer holds at that moment (a worker storing the push's vectors) is left
    # to the job's next run, as in production: run it again until the memory is gone.
    deadline = time.monotonic() + 30
    while ttl_purge().counts["purged"] == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Memory.objects.filter(pk=memory.pk).exists()


@pytest.fixture
def cast(db: None) -> School:
    return school_cast()


def _memory(school: School, record_id: str) -> Memory:
    return Memory.objects.get(stack=school.stack, record_id=record_id)


def test_forget_purge_and_erasure_reach_the_second_device_as_tombstones_in_order(cast: School) -> None:
    _push(cast, "alice", ["n1", "n2", "n3", "n4"])
    device_b = _pull(cast.agent, "alice")
    assert sorted(c["record_id"] for c in device_b["changes"]) == ["n1", "n2", "n3", "n4"]
    n1, n2, n3 = (_memory(cast, rid) for rid in ("n1", "n2", "n3"))

    _forget_on_dashboard(cast, n1)
    _purge_by_ttl(n2)
    _erase(cast, n3)

    response = cast.agent.get("/api/v1/stacks/alice/sync/pull", {"cursor": device_b["next_cursor"]})
    assert SECRET not in response.content.decode()  # ids only: no forgotten, purged or erased text
    changes = response.json()["changes"]
    assert [(c["op"], c["id"], c["reason"]) for c in changes] == [
        ("forget", str(n1.pk), "forgotten"), ("delete", str(n2.pk), "expired"), ("delete", str(n3.pk), "erased")]
    assert changes[0]["record_id"] == "n1" and changes[0]["kind"] == "note" and changes[0]["data"] == {}
    assert changes[1]["data"] == {} and changes[2]["data"] == {}
    assert all(set(change) == set(changes[0]) for change in changes)  # one shape, tombstone or not
    assert response.json()["has_more"] is False

    # A kernle device still holding the three re-pushes them: every operation acknowledged (its queue
    # drains), nothing comes back; the purged and erased ones are named as refused.
    pushed = cast.agent.post("/sync/push", {"stack_id": "alice", "operations": [
        _kernle_op("n1"), _kernle_op("n2"), _kernle_op("n3")]}, format="json").json()
    assert [a["record_id"] for a in pushed["acknowledged_operations"]] == ["n1", "n2", "n3"]
    assert sorted(c["record_id"] for c in pushed["conflicts"]) == ["n2", "n3"]
    assert _memory(cast, "n1").forgotten_at is not None
    assert not Memory.objects.filter(stack=cast.stack, record_id__in=["n2", "n3"]).exists()
    # …and the second device has nothing new to apply.
    after = _pull(cast.agent, "alice", response.json()["next_cursor"])
    assert after["changes"] == []


def test_a_recovered_memory_comes_back_with_its_record(cast: School) -> None:
    _push(cast, "alice", ["n1"])
    n1 = _memory(cast, "n1")
    first = _pull(cast.agent, "alice")
    assert cast.admin_api.post(cast.stack_url(f"memories/{n1.pk}/forget"), {"reason": "x"},
                               format="json").status_code == 200
    forgotten = _pull(cast.agent, "alice", first["next_cursor"])
    assert [(c["op"], c["data"]) for c in forgotten["changes"]] == [("forget", {})]
    assert cast.admin_api.post(cast.stack_url(f"memories/{n1.pk}/recover"), format="json").status_code == 200
    recovered = _pull(cast.agent, "alice", forgotten["next_cursor"])["changes"]
    assert [(c["op"], c["forgotten"], c["data"]["content"]) for c in recovered] == [("upsert", False, f"{SECRET} n1")]


def test_pages_walk_rows_and_removals_in_change_order(cast: School) -> None:
    _push(cast, "alice", ["n1", "n2", "n3"])
    start = _pull(cast.agent, "alice")["next_cursor"]
    _purge_by_ttl(_memory(cast, "n1"))
    _push(cast, "alice", ["n4"])
    _erase(cast, _memory(cast, "n2"))
    _push(cast, "alice", ["n5"])
    seen: list[tuple[str, str]] = []
    cursor, pages = start, 0
    while True:
        page = _pull(cast.agent, "alice", cursor, limit=1)
        pages += 1
        seen += [(c["op"], c["record_id"] or c["reason"]) for c in page["changes"]]
        cursor = page["next_cursor"]
        if not page["has_more"]:
            break
    assert seen == [("delete", "expired"), ("upsert", "n4"), ("delete", "erased"), ("upsert", "n5")]
    assert pages == 4
    assert _pull(cast.agent, "alice", cursor)["changes"] == []


def test_removals_outlive_the_event_prune(cast: School) -> None:
    """A device that pulls rarely still hears of a purge: its event is not pruned with the others."""
    _push(cast, "alice", ["n1", "n2"])
    start = _pull(cast.agent, "alice")["next_cursor"]
    n1 = _memory(cast, "n1")
    _purge_by_ttl(n1)
    events_relay()  # only published events are pruned
    events_prune(now=timezone.now() + timedelta(days=30))
    changes = _pull(cast.agent, "alice", start)["changes"]
    assert [(c["op"], c["id"]) for c in changes] == [("delete", str(n1.pk))]


def test_kernle_pull_leaves_out_what_a_kernle_device_cannot_apply(cast: School) -> None:
    _push(cast, "alice", ["n1", "n2", "n3", "n4"])
    _forget_on_dashboard(cast, _memory(cast, "n1"))
    _purge_by_ttl(_memory(cast, "n2"))
    _erase(cast, _memory(cast, "n3"))
    pulled = cast.agent.post("/sync/pull", {"stack_id": "alice", "since": None}, format="json").json()
    assert [op["record_id"] for op in pulled["operations"]] == ["n4"]
    assert {op["operation"] for op in pulled["operations"]} == {"update"}


def test_another_stacks_removals_never_appear(cast: School) -> None:
    _push(cast, "alice", ["a1"])
    _push(cast, "bob", ["b1", "b2", "b3"])
    start = _pull(cast.agent, "alice")["next_cursor"]
    bob = {rid: Memory.objects.get(stack=cast.other_stack, record_id=rid) for rid in ("b1", "b2", "b3")}
    _forget_on_dashboard(cast, bob["b1"])
    _purge_by_ttl(bob["b2"])
    response = cast.admin_api.post(f"/api/v1/stacks/bob/memories/{bob['b3'].pk}/erase",
                                   {"requested_by": "x"}, format="json")
    assert response.status_code == 200, response.content
    assert _pull(cast.agent, "alice", start)["changes"] == []
    assert _pull(cast.agent, "alice")["changes"][0]["record_id"] == "a1"
    assert cast.agent.get("/api/v1/stacks/bob/sync/pull").status_code == 404
    # The school key reaching bob sees bob's removals, and only bob's.
    bobs = _pull(cast.admin_api, "bob", _pull(cast.admin_api, "bob")["next_cursor"])
    assert bobs["changes"] == []
    everything = _pull(cast.admin_api, "bob")["changes"]
    assert {c["id"] for c in everything} == {str(m.pk) for m in bob.values()}
