"""The Kernle sync protocol (docs/kernle-protocol.md §3-§4) through HTTP, against the real database."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction

from accounts.models import Organization
from accounts.throttles import throttle_state_clear
from memories.models import Memory, MemoryRevision, MemorySalience, SyncWatermark
from memoryhub.limits import JSON_MAX_STRING_CHARS
from stacks.models import Stack
from stacks.services import personal_account_register
from tests.factories import bearer_client, make_key, make_org, make_stack

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_throttles() -> Iterator[None]:
    """Every request here comes from 127.0.0.1: start each test with a full per-IP budget."""
    throttle_state_clear()
    yield

T0 = datetime(2026, 11, 21, 23, 0, tzinfo=UTC)


def ts(minutes: float = 0) -> str:
    return (T0 + timedelta(minutes=minutes)).isoformat()


def episode(record_id: str, *, minutes: float = 0, **fields: Any) -> dict[str, Any]:
    data = {"id": record_id, "stack_id": "acceptance", "objective": "Deployed v2", "outcome": "success",
            "outcome_type": "success", "lessons": ["Run migrations first"], "tags": ["deploy"],
            "created_at": ts(minutes), "local_updated_at": ts(minutes), "cloud_synced_at": None, "version": 1,
            "deleted": False, "strength": 1.0, "repeat": None, "epoch_id": None}
    data.update(fields)
    return {"operation": "update", "table": "episodes", "record_id": record_id, "local_updated_at": ts(minutes),
            "version": 1, "data": data}


def value_op(record_id: str, **fields: Any) -> dict[str, Any]:
    data = {"id": record_id, "name": "honesty", "statement": "Tell the truth", "priority": 80,
            "created_at": None, "local_updated_at": None, "some_future_field": {"x": 1}}
    data.update(fields)
    return {"operation": "update", "table": "agent_values", "record_id": record_id, "local_updated_at": None,
            "version": 1, "data": data}


@pytest.fixture
def account() -> dict[str, Any]:
    reg = personal_account_register(stack_id="acceptance", email=f"{uuid.uuid4().hex[:8]}@example.test")
    return {"client": bearer_client(reg.secret), "stack": reg.stack, "org": reg.organization, "reg": reg}


def push(client: Any, operations: list[Any], stack_id: str = "acceptance") -> Any:
    return client.post("/sync/push", {"stack_id": stack_id, "operations": operations}, format="json")


def pull(client: Any, since: str | None = None, stack_id: str = "acceptance", *, omit_since: bool = False) -> Any:
    body: dict[str, Any] = {"stack_id": stack_id}
    if not omit_since:
        body["since"] = since
    return client.post("/sync/pull", body, format="json")


def memories_of(stack: Stack) -> list[Memory]:
    return list(Memory.objects.filter(stack=stack).order_by("record_id"))


def test_push_applies_and_acknowledges_with_the_wire_table_name(account: dict[str, Any]) -> None:
    response = push(account["client"], [episode("e1"), value_op("v1")])
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["synced"] == 2 and body["conflicts"] == []
    assert body["acknowledged_operations"] == [{"table": "episodes", "record_id": "e1"},
                                               {"table": "agent_values", "record_id": "v1"}]
    assert body["server_time"].endswith("+00:00")
    rows = {m.record_id: m for m in memories_of(account["stack"])}
    assert rows["e1"].kind == "episode" and rows["e1"].data["objective"] == "Deployed v2"
    assert rows["v1"].kind == "value" and rows["v1"].extra == {"some_future_field": {"x": 1}}
    assert rows["e1"].client_version == 1 and rows["e1"].version == 1
    assert rows["e1"].client_updated_at == T0
    assert rows["e1"].embedded_version is None  # awaiting embedding
    stack = Stack.objects.get(pk=account["stack"].pk)
    assert stack.memory_count == 2 and stack.bytes_used == sum(m.size_bytes for m in rows.values())
    assert stack.last_sync_at is not None


def test_same_push_twice_changes_nothing_and_gives_the_same_outcome(account: dict[str, Any]) -> None:
    ops = [episode("e1"), value_op("v1", local_updated_at=ts(1)), {"operation": "bogus", "table": "notes",
                                                                     "record_id": "n1", "data": {}}]
    first = push(account["client"], ops).json()
    before = {m.record_id: (m.version, m.change_seq, m.server_updated_at, m.data, m.text)
              for m in memories_of(account["stack"])}
    bytes_before = Stack.objects.get(pk=account["stack"].pk).bytes_used
    second = push(account["client"], ops).json()
    after = {m.record_id: (m.version, m.change_seq, m.server_updated_at, m.data, m.text)
             for m in memories_of(account["stack"])}
    assert {k: v for k, v in first.items() if k != "server_time"} == \
        {k: v for k, v in second.items() if k != "server_time"}
    assert first["synced"] == 2 and len(first["conflicts"]) == 1
    assert before == after
    assert Stack.objects.get(pk=account["stack"].pk).bytes_used == bytes_before
    assert MemoryRevision.objects.count() == 0


def test_one_invalid_operation_among_valid_ones(account: dict[str, Any]) -> None:
    bad_episode = episode("e-bad")
    del bad_episode["data"]["objective"]
    ops = [
        {"operation": "update", "table": "bogus_table", "record_id": "probe-1", "local_updated_at": None,
         "version": 1, "data": {"id": "probe-1"}},
        {"operation": "delete", "table": "raw_captures", "record_id": "never-seen",
         "local_updated_at": ts(), "version": 1},
        episode("e1"),
        bad_episode,
        {"operation": "update", "table": "notes", "record_id": "n-nodata", "version": 1},
        "not an object",
        value_op("probe-v1"),
    ]
    body = push(account["client"], ops).json()
    assert body["synced"] == len(ops) - len(body["conflicts"]) == 3
    errors = {(c["table"], c["record_id"]): c["error"] for c in body["conflicts"]}
    assert errors[("bogus_table", "probe-1")] == "unsupported table"
    assert "objective" in errors[("episodes", "e-bad")]
    assert errors[("notes", "n-nodata")] == "Missing data for insert/update"
    assert (None, None) in errors
    # Refused operations are acknowledged too (the client would re-send them forever otherwise);
    # only the one without a record id has nothing to acknowledge (docs/kernle-protocol.md §3.11).
    assert body["acknowledged_operations"] == [{"table": op["table"], "record_id": op["record_id"]}
                                               for op in ops if isinstance(op, dict)]
    assert sorted(m.record_id for m in memories_of(account["stack"])) == ["e1", "probe-v1"]


@pytest.mark.parametrize("body", [[], "text", {"stack_id": "acceptance"}, {"stack_id": "acceptance",
                                                                           "operations": {"a": 1}}])
def test_malformed_envelope_is_400_and_stores_nothing(account: dict[str, Any], body: Any) -> None:
    response = account["client"].post("/sync/push", body, format="json")
    assert response.status_code == 400
    assert response.json()["detail"]
    assert Memory.objects.count() == 0


@pytest.mark.parametrize("stack_id", ["", "a/b", "..", "x" * 101, None, 5])
def test_invalid_stack_id_is_400(account: dict[str, Any], stack_id: Any) -> None:
    response = push(account["client"], [episode("e1")], stack_id=stack_id)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_stack_id"
    assert Memory.objects.count() == 0


def test_push_cannot_set_server_controlled_fields(account: dict[str, Any]) -> None:
    op = episode("e1", id="someone-else", stack_id="other", version=7, embedding=[0.1] * 384,
                 server_updated_at="2000-01-01T00:00:00+00:00", change_seq=1, stability=99.0,
                 difficulty=0.1, salience=1.0, size_bytes=1, embedded_version=3, agent_id="x",
                 forgotten_at="2020-01-01T00:00:00+00:00", forgotten_reason="decay", deleted=False)
    assert push(account["client"], [op]).json()["synced"] == 1
    memory = Memory.objects.get(stack=account["stack"])
    assert memory.record_id == "e1"  # record_id wins over data.id
    assert memory.version == 1 and memory.client_version == 7  # the client's version is echoed, not ours
    assert memory.embedding is None and memory.embedded_version is None
    assert memory.stability == 1.0 and memory.difficulty == 5.0
    assert "salience" not in memory.extra and not MemorySalience.objects.filter(memory=memory).exists()
    assert memory.forgotten_at is None and memory.deleted_at is None
    assert memory.server_updated_at.year == datetime.now(UTC).year
    assert memory.size_bytes > 1
    for key in ("id", "stack_id", "embedding", "server_updated_at", "change_seq", "stability", "agent_id",
                "forgotten_at", "size_bytes"):
        assert key not in memory.extra and key not in memory.data


def test_strength_zero_forgets_and_pull_excludes_it_and_recover_brings_it_back(account: dict[str, Any]) -> None:
    client = account["client"]
    push(client, [episode("e1"), episode("e2")])
    assert push(client, [episode("e1", minutes=1, strength=0.0)]).json()["synced"] == 1
    memory = Memory.objects.get(record_id="e1")
    assert memory.forgotten_at is not None and memory.forgotten_reason == "client_forget"
    assert [op["record_id"] for op in pull(client, omit_since=True).json()["operations"]] == ["e2"]
    push(client, [episode("e1", minutes=2, strength=0.2)])  # kernle's recover
    assert Memory.objects.get(record_id="e1").forgotten_at is None
    assert sorted(op["record_id"] for op in pull(client, omit_since=True).json()["operations"]) == ["e1", "e2"]


def test_client_update_does_not_resurrect_a_server_forgotten_or_deleted_memory(account: dict[str, Any]) -> None:
    client = account["client"]
    push(client, [episode("e1"), episode("e2")])
    Memory.objects.filter(record_id="e1").update(forgotten_at=T0, forgotten_reason="decay")
    push(client, [{"operation": "delete", "table": "episodes", "record_id": "e2", "local_updated_at": ts(1)}])
    before = {m.record_id: (m.version, m.data) for m in memories_of(account["stack"])}
    body = push(client, [episode("e1", minutes=5, objective="Edited on a stale device"),
                         episode("e2", minutes=5, objective="Edited after delete")]).json()
    assert body["synced"] == 2 and body["conflicts"] == []  # acknowledged, so not re-sent forever
    rows = {m.record_id: m for m in memories_of(account["stack"])}
    assert rows["e1"].forgotten_at is not None and rows["e1"].forgotten_reason == "decay"
    assert rows["e2"].deleted_at is not None
    assert {k: (m.version, m.data) for k, m in rows.items()} == before
    assert pull(client, omit_since=True).json()["operations"] == []


def test_delete_is_a_tombstone_and_frees_quota(account: dict[str, Any]) -> None:
    client = account["client"]
    push(client, [episode("e1"), episode("e2")])
    body = push(client, [{"operation": "delete", "table": "episodes", "record_id": "e1",
                          "local_updated_at": ts(1), "version": 1}]).json()
    assert body["synced"] == 1
    memory = Memory.objects.get(record_id="e1")
    assert memory.deleted_at is not None and memory.version == 2
    assert MemoryRevision.objects.filter(memory=memory, action="delete").count() == 1
    stack = Stack.objects.get(pk=account["stack"].pk)
    assert stack.memory_count == 1 and stack.bytes_used == Memory.objects.get(record_id="e2").size_bytes


def test_update_with_deleted_true_is_a_soft_delete(account: dict[str, Any]) -> None:
    push(account["client"], [episode("e1")])
    push(account["client"], [episode("e1", minutes=1, deleted=True)])
    assert Memory.objects.get(record_id="e1").deleted_at is not None


def test_two_devices_last_writer_by_timestamp_wins_and_lists_are_unioned(account: dict[str, Any]) -> None:
    client = account["client"]
    # Device A edits at minute 10; device B edited earlier (minute 5) but syncs later.
    push(client, [episode("e1", minutes=0, tags=["base"])])
    a = push(client, [episode("e1", minutes=10, objective="A's objective", tags=["base", "a"],
                              lessons=["lesson A"], version=2)]).json()
    b = push(client, [episode("e1", minutes=5, objective="B's objective", tags=["b"],
                              lessons=["lesson B"], version=2)]).json()
    assert a["synced"] == 1 and b["synced"] == 1 and b["conflicts"] == []  # a stale write is never a conflict
    memory = Memory.objects.get(record_id="e1")
    assert memory.data["objective"] == "A's objective"  # the later edit wins
    assert memory.client_updated_at == T0 + timedelta(minutes=10)
    assert set(memory.tags) == {"base", "a", "b"}  # list fields are unioned
    assert set(memory.data["lessons"]) == {"Run migrations first", "lesson A", "lesson B"}
    # The newer device then edits again: it wins, lists still keep every item seen.
    push(client, [episode("e1", minutes=20, objective="A again", tags=["c"], version=3)])
    memory = Memory.objects.get(record_id="e1")
    assert memory.data["objective"] == "A again" and set(memory.tags) == {"base", "a", "b", "c"}
    assert memory.client_version == 3
    assert memory.version == 4  # one server version per accepted change
    assert MemoryRevision.objects.filter(memory=memory).count() == 3


def test_list_union_is_capped(account: dict[str, Any]) -> None:
    from memories.sync.protocol import ARRAY_CAP
    push(account["client"], [episode("e1", tags=[f"a{i}" for i in range(300)])])
    push(account["client"], [episode("e1", minutes=1, tags=[f"b{i}" for i in range(300)])])
    assert len(Memory.objects.get(record_id="e1").tags) == ARRAY_CAP


def test_pull_shape_only_updates_supported_tables_aware_timestamps_and_version_echo(account: dict[str, Any]) -> None:
    client = account["client"]
    raw = {"operation": "update", "table": "raw_captures", "record_id": "r1",
           "data": {"id": "r1", "blob": "hello", "captured_at": "2026-11-21T23:00:00", "source": "cli"}}
    drive_ok = {"operation": "update", "table": "drives", "record_id": "d1",
                "data": {"drive_type": "curiosity", "intensity": 0.7, "focus_areas": ["testing"],
                         "updated_at": "2026-11-21T23:00:00", "version": 4}}
    body = push(client, [episode("e1", last_verified="2026-11-21T22:00:00"), value_op("v1"), raw, drive_ok]).json()
    assert body["synced"] == 4
    response = pull(client, omit_since=True)
    assert response.status_code == 200
    doc = response.json()
    assert doc["has_more"] is False
    ops = {op["record_id"]: op for op in doc["operations"]}
    assert set(ops) == {"e1", "v1", "d1"}  # raw captures never go to a 0.15.0 client
    assert {op["operation"] for op in ops.values()} == {"update"}
    assert ops["v1"]["table"] == "values" and ops["e1"]["table"] == "episodes"
    assert ops["d1"]["data"]["version"] == 4 and ops["e1"]["data"]["version"] == 1
    assert ops["v1"]["data"]["some_future_field"] == {"x": 1}  # unknown fields come back
    assert ops["e1"]["data"]["lessons_learned"] == ["Run migrations first"]
    for op in ops.values():
        for key in ("created_at", "local_updated_at", "cloud_synced_at"):
            value = op["data"][key]
            assert value.endswith("Z") or value[-6] in "+-", (key, value)
    assert ops["e1"]["data"]["last_verified"] == "2026-11-21T22:00:00+00:00"
    assert ops["d1"]["data"]["updated_at"] == "2026-11-21T23:00:00+00:00"
    for forbidden in ("embedding", "server_updated_at", "stability", "size_bytes", "deleted_at"):
        assert forbidden not in ops["e1"]["data"]


def test_pull_leaves_out_records_a_client_cannot_apply(account: dict[str, Any]) -> None:
    push(account["client"], [episode("e1")])
    Memory.objects.filter(record_id="e1").update(kind="drive", data={"drive_type": "", "intensity": 0.5,
                                                                     "focus_areas": []})
    assert pull(account["client"], omit_since=True).json()["operations"] == []


def test_incremental_pull_across_a_clock_skew_of_minutes(account: dict[str, Any]) -> None:
    client = account["client"]
    push(client, [episode("e1")])
    first = pull(client, omit_since=True).json()
    assert [op["record_id"] for op in first["operations"]] == ["e1"]
    # The device's clock runs 10 minutes fast: its `since` is in our future.
    device_now = datetime.now(UTC) + timedelta(minutes=10)
    push(client, [episode("e2")])
    second = pull(client, since=device_now.isoformat()).json()
    assert [op["record_id"] for op in second["operations"]] == ["e2"]
    third = pull(client, since=(device_now + timedelta(seconds=5)).isoformat()).json()
    assert third["operations"] == []
    # A device whose clock is 10 minutes slow gets a few harmless duplicates, never a gap.
    push(client, [episode("e3")])
    slow = pull(client, since=(datetime.now(UTC) - timedelta(minutes=10)).isoformat()).json()
    assert "e3" in [op["record_id"] for op in slow["operations"]]
    assert SyncWatermark.objects.filter(stack=account["stack"]).count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_pull_waits_for_a_push_in_flight_and_carries_what_it_committed() -> None:
    """A pull that arrives while a push holds the stack gets what that push commits (it reads the
    change set once the push is done, not a snapshot from before), with a server time after it: the
    next incremental pull skips nothing (docs/kernle-protocol.md §4.4)."""
    throttle_state_clear()
    reg = personal_account_register(stack_id="acceptance", email=f"{uuid.uuid4().hex[:8]}@example.test")
    client = bearer_client(reg.secret)
    push(client, [episode("e1")])
    since = pull(client, omit_since=True).json()["server_time"]
    locked, release = threading.Event(), threading.Event()

    def push_in_flight() -> None:  # what a push does: the stack's lock, its rows, then the commit
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT 1 FROM stacks_stack WHERE id = %s FOR NO KEY UPDATE", [reg.stack.pk])
                cursor.execute("UPDATE memories_memory SET data = data || '{\"objective\": \"Deployed v3\"}', "
                               "server_updated_at = clock_timestamp() WHERE stack_id = %s AND record_id = 'e1'",
                               [reg.stack.pk])
                locked.set()
                release.wait(10)
        finally:
            connection.close()

    writer = threading.Thread(target=push_in_flight)
    writer.start()
    assert locked.wait(10)
    threading.Timer(0.5, release.set).start()
    started = time.monotonic()
    during = pull(client, since=since).json()
    writer.join(10)
    assert time.monotonic() - started >= 0.4  # it waited for the push
    assert [(op["record_id"], op["data"]["objective"]) for op in during["operations"]] == [("e1", "Deployed v3")]
    assert pull(client, since=during["server_time"]).json()["operations"] == []


def test_pull_of_a_stack_never_pushed_is_empty(account: dict[str, Any]) -> None:
    org_key = make_key(account["org"], user=account["reg"].user)[1]
    response = pull(bearer_client(org_key), stack_id="never-pushed", omit_since=True)
    assert response.status_code == 200 and response.json()["operations"] == []


def test_first_push_provisions_a_stack_within_the_stack_quota(account: dict[str, Any]) -> None:
    org: Organization = account["org"]
    _, secret = make_key(org, user=account["reg"].user)  # an unbound key of the personal account
    client = bearer_client(secret)
    # Free tier: one syncing stack, already taken by "acceptance" → every upsert is a conflict.
    body = push(client, [episode("e1"), {"operation": "delete", "table": "notes", "record_id": "n1"}],
                stack_id="second").json()
    assert body["synced"] == 1 and "stack limit reached (free: 1 syncing stack)" in body["conflicts"][0]["error"]
    assert not Stack.objects.filter(slug="second").exists()
    org.tier = "core"
    org.save()
    body = push(client, [episode("e1")], stack_id="second").json()
    assert body["synced"] == 1
    stack = Stack.objects.get(organization=org, slug="second")
    assert stack.kind == Stack.Kind.AGENT and Memory.objects.filter(stack=stack).count() == 1


def test_a_string_too_long_for_any_record_is_one_operations_refusal(account: dict[str, Any]) -> None:
    """Over the JSON string bound (1 MiB) of other routes: refusing the whole push would leave the
    device's whole batch queued for ever; the sync push refuses only that operation, and
    acknowledges it (docs/kernle-protocol.md §3.11)."""
    huge = episode("e-huge", objective="y" * (JSON_MAX_STRING_CHARS + 1))
    body = push(account["client"], [episode("e1"), huge]).json()
    assert body["synced"] == 1 and [c["record_id"] for c in body["conflicts"]] == ["e-huge"]
    assert "objective" in body["conflicts"][0]["error"]
    assert [a["record_id"] for a in body["acknowledged_operations"]] == ["e1", "e-huge"]
    assert [m.record_id for m in memories_of(account["stack"])] == ["e1"]
    # The same body on a route that is not a sync push is still refused whole.
    other = account["client"].post("/api/v1/stacks/acceptance/search", {"query": "y" * (JSON_MAX_STRING_CHARS + 1)},
                                   format="json")
    assert other.status_code == 400 and other.json()["error"]["code"] == "json_string_too_long"


def test_storage_quota_gives_per_operation_conflicts_and_stores_nothing(account: dict[str, Any]) -> None:
    client = account["client"]
    push(client, [episode("e1")])
    Stack.objects.filter(pk=account["stack"].pk).update(bytes_used=10 * 1024 * 1024 - 10)
    body = push(client, [episode("e2"), episode("e3", minutes=1, strength=0.0),
                         {"operation": "delete", "table": "episodes", "record_id": "e1"}]).json()
    errors = {c["record_id"]: c["error"] for c in body["conflicts"]}
    assert errors == {"e2": "storage quota exceeded (free: 10 MB) — upgrade or delete memories",
                      "e3": "storage quota exceeded (free: 10 MB) — upgrade or delete memories"}
    # Refused, but acknowledged: the device stops re-sending them; the refusal is in its conflict log.
    assert [a["record_id"] for a in body["acknowledged_operations"]] == ["e2", "e3", "e1"]
    assert sorted(m.record_id for m in memories_of(account["stack"])) == ["e1"]
    # The delete freed room: the record pushed again (after an edit) now stores what fits.
    assert push(client, [episode("e2")]).json()["synced"] == 1


class TestIsolation:
    def test_key_bound_to_another_stack_gets_a_clear_error_and_nothing_is_stored(self, account: dict[str, Any]) -> None:
        response = push(account["client"], [episode("e1")], stack_id="someone-else")
        assert response.status_code == 404
        assert "bound to stack 'acceptance'" in response.json()["detail"]
        assert Memory.objects.count() == 0 and not Stack.objects.filter(slug="someone-else").exists()
        assert pull(account["client"], stack_id="someone-else", omit_since=True).status_code == 404

    def test_another_schools_key_cannot_read_or_write(self, account: dict[str, Any]) -> None:
        school = make_org()
        stack = make_stack(school, "student-1")
        _, school_secret = make_key(school)
        school_client = bearer_client(school_secret)
        assert push(school_client, [episode("s1")], stack_id="student-1").json()["synced"] == 1
        # The personal account's key names the school's stack id: not reachable, nothing stored.
        _, unbound = make_key(account["org"], user=account["reg"].user)
        response = push(bearer_client(unbound), [episode("x1")], stack_id="student-1")
        assert response.status_code == 200  # provisioning its own "student-1" is refused by quota …
        assert response.json()["synced"] == 0
        assert Memory.objects.filter(record_id="x1").count() == 0
        assert pull(bearer_client(unbound), stack_id="student-1", omit_since=True).json()["operations"] == []
        # … and another school's key sees nothing of this school's stack either.
        other = make_org()
        _, other_secret = make_key(other)
        response = push(bearer_client(other_secret), [episode("x2")], stack_id="student-1")
        assert response.status_code == 404
        assert pull(bearer_client(other_secret), stack_id="student-1", omit_since=True).json()["operations"] == []
        assert list(Memory.objects.values_list("record_id", flat=True)) == ["s1"]
        assert Memory.objects.get().stack == stack

    def test_school_key_reaches_any_stack_of_its_school_but_does_not_create_stacks(self) -> None:
        school = make_org()
        make_stack(school, "student-1")
        make_stack(school, "student-2")
        client = bearer_client(make_key(school)[1])
        assert push(client, [episode("a")], stack_id="student-1").json()["synced"] == 1
        assert push(client, [episode("b")], stack_id="student-2").json()["synced"] == 1
        response = push(client, [episode("c")], stack_id="student-3")
        assert response.status_code == 404
        assert not Stack.objects.filter(slug="student-3").exists()

    def test_read_only_key_cannot_push(self) -> None:
        school = make_org()
        stack = make_stack(school, "student-1")
        client = bearer_client(make_key(school, stack=stack, read_only=True)[1])
        response = push(client, [episode("e1")], stack_id="student-1")
        assert response.status_code == 403
        assert Memory.objects.count() == 0
        assert pull(client, stack_id="student-1", omit_since=True).status_code == 200

    def test_archived_stack_refuses_pushes(self) -> None:
        school = make_org()
        stack = make_stack(school, "student-1", status=Stack.Status.ARCHIVED)
        response = push(bearer_client(make_key(school, stack=stack)[1]), [episode("e1")], stack_id="student-1")
        assert response.status_code == 409 and Memory.objects.count() == 0

    def test_unauthenticated_is_401(self) -> None:
        from rest_framework.test import APIClient
        response = APIClient().post("/sync/push", {"stack_id": "x", "operations": []}, format="json")
        assert response.status_code == 401 and response["WWW-Authenticate"] == "Bearer"
        bad = bearer_client("knl_sk_00000000000000000000000000000000")
        assert bad.post("/sync/pull", {"stack_id": "x"}, format="json").status_code == 401


def test_awkward_text_round_trips_exactly(account: dict[str, Any]) -> None:
    tags = ['a,b', 'quote"d', "back\\slash", "{brace}", "NULL", "", "tab\there", "ünïcødé ✓", "new\nline"]
    extra: dict[str, Any] = {"nested": {"k": ["x", None, 1.5]}, "remark": "\\N is not null"}
    body = push(account["client"], [episode("e1", tags=tags, objective="Line1\nLine2 \\ \"q\"", **extra)]).json()
    assert body["synced"] == 1, body
    memory = Memory.objects.get(record_id="e1")
    assert memory.tags == tags
    assert memory.data["objective"] == "Line1\nLine2 \\ \"q\""
    assert memory.extra["nested"] == {"k": ["x", None, 1.5]} and memory.extra["remark"] == "\\N is not null"
    pulled = pull(account["client"], omit_since=True).json()["operations"][0]["data"]
    assert pulled["tags"] == tags and pulled["nested"] == {"k": ["x", None, 1.5]}


@pytest.mark.django_db(transaction=True)
def test_pushed_memories_are_embedded_by_the_worker_after_commit(celery_worker: Any) -> None:
    import time

    reg = personal_account_register(stack_id="acceptance", email="embed@example.test")
    client = bearer_client(reg.secret)
    assert push(client, [episode("e1"), value_op("v1")]).json()["synced"] == 2
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pending = Memory.objects.filter(stack=reg.stack, embedded_version__isnull=True).count()
        if pending == 0:
            break
        time.sleep(0.2)
    rows = list(Memory.objects.filter(stack=reg.stack))
    assert [m.embedded_version for m in rows] == [m.version for m in rows]
    assert all(m.embedding is not None and len(m.embedding) == 384 for m in rows)


def test_a_push_body_over_10_mb_is_accepted(account: dict[str, Any]) -> None:
    org: Organization = account["org"]
    org.tier = "core"  # 100 MB: the free tier's 10 MB could not hold this push
    org.save()
    long_text = "Fractions and decimals practice " * 350  # ~11 KB per record
    ops = [episode(f"e{i}", objective=long_text) for i in range(1000)]
    import json as _json
    assert len(_json.dumps({"stack_id": "acceptance", "operations": ops})) > 10 * 1024 * 1024
    body = push(account["client"], ops).json()
    assert body["synced"] == 1000 and body["conflicts"] == []
    assert Memory.objects.filter(stack=account["stack"]).count() == 1000


def test_a_record_the_database_refuses_fails_alone(account: dict[str, Any]) -> None:
    from django.db import connection

    # A real refusal by Postgres (not a mock): a trigger rejecting one record id. The set-based
    # write fails, and the engine retries record by record, each in its own savepoint.
    with connection.cursor() as cursor:
        cursor.execute("""
            CREATE FUNCTION test_refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN IF NEW.record_id = 'poison' THEN RAISE EXCEPTION 'refused'; END IF; RETURN NEW; END $$;
            CREATE TRIGGER test_refuse_poison BEFORE INSERT OR UPDATE ON memories_memory
            FOR EACH ROW EXECUTE FUNCTION test_refuse_poison();""")
    body = push(account["client"], [episode("ok1"), episode("poison"), episode("ok2")]).json()
    assert body["synced"] == 2
    assert body["conflicts"] == [{"table": "episodes", "record_id": "poison", "operation": "update",
                                  "error": "the record could not be stored; check its fields"}]
    assert sorted(m.record_id for m in memories_of(account["stack"])) == ["ok1", "ok2"]
    stack = Stack.objects.get(pk=account["stack"].pk)
    assert stack.memory_count == 2


def test_orm_fallback_when_the_table_has_columns_copy_does_not_know(account: dict[str, Any],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from memories.writes import sets

    monkeypatch.setattr(sets, "_COPY_OK", False)
    assert push(account["client"], [episode("e1"), value_op("v1")]).json()["synced"] == 2
    assert Memory.objects.get(record_id="e1").data["objective"] == "Deployed v2"


def kernle_op(table: str, record_id: str, minutes: float = 0, **data: Any) -> dict[str, Any]:
    return {"operation": "update", "table": table, "record_id": record_id, "local_updated_at": ts(minutes),
            "version": 1, "data": {"id": record_id, "created_at": ts(minutes), "local_updated_at": ts(minutes),
                                   "version": 1, **data}}


def test_records_no_kernle_device_could_apply_are_stored_acknowledged_and_never_pulled(
        account: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    """docs/kernle-protocol.md §3.9: a drive without drive_type, a relationship without
    entity_name, a playbook without name: the device's data, so stored and acknowledged (a conflict
    would be re-sent forever), but a 0.15.0 device fails on them, so kernle pulls leave them out."""
    client = account["client"]
    playbook_fields: dict[str, Any] = {"description": "When stuck", "trigger_conditions": ["stuck"],
                                       "steps": [{"do": "breathe"}], "failure_modes": []}
    unappliable = [
        kernle_op("drives", "d-missing", intensity=0.7, focus_areas=["x"]),
        kernle_op("drives", "d-null", drive_type=None),
        kernle_op("relationships", "r-empty", entity_name="", entity_type="person", relationship_type="friend"),
        kernle_op("playbooks", "p-blank", name="   ", **playbook_fields),
    ]
    ops = [episode("e1"), *unappliable, kernle_op("drives", "d-ok", drive_type="curiosity")]
    with caplog.at_level(logging.WARNING, logger="memories.sync"):
        body = push(client, ops).json()
    assert body["conflicts"] == [] and body["synced"] == len(ops)
    assert body["acknowledged_operations"] == [{"table": op["table"], "record_id": op["record_id"]} for op in ops]
    stored = {m.record_id: m for m in memories_of(account["stack"])}
    assert set(stored) == {op["record_id"] for op in ops}
    assert stored["d-missing"].data["drive_type"] == "" and stored["d-missing"].data["focus_areas"] == ["x"]
    assert stored["r-empty"].data["entity_name"] == "" and stored["p-blank"].data["name"] == "   "
    assert Stack.objects.get(pk=account["stack"].pk).memory_count == len(ops)
    logged = " ".join(r.getMessage() for r in caplog.records)
    for op in unappliable:
        assert op["record_id"] in logged
    assert "'d-ok'" not in logged and "'e1'" not in logged

    full = pull(client, omit_since=True).json()
    assert sorted(op["record_id"] for op in full["operations"]) == ["d-ok", "e1"]
    incremental = pull(client, since=(T0 - timedelta(days=1)).isoformat()).json()
    assert sorted(op["record_id"] for op in incremental["operations"]) == ["d-ok", "e1"]
    # A native client is not a 0.15.0 device: its cursor feed is every stored change, these included.
    native = client.get(f"/api/v1/stacks/{account['stack'].slug}/sync/pull").json()
    assert sorted(c["record_id"] for c in native["changes"]) == sorted(op["record_id"] for op in ops)

    # Re-sent (e.g. after a crash): the same outcome, nothing changes.
    versions = {m.record_id: m.version for m in memories_of(account["stack"])}
    again = push(client, ops).json()
    assert again["conflicts"] == [] and again["synced"] == len(ops)
    assert {m.record_id: m.version for m in memories_of(account["stack"])} == versions
    # Once the device names the drive, every device receives it.
    push(client, [kernle_op("drives", "d-missing", minutes=5, drive_type="rest")])
    assert "d-missing" in [op["record_id"] for op in pull(client, omit_since=True).json()["operations"]]


def test_operations_of_one_push_apply_in_order(account: dict[str, Any]) -> None:
    client = account["client"]
    delete = {"operation": "delete", "table": "episodes", "local_updated_at": ts(3), "version": 1}
    ops = [
        episode("e1", minutes=0, objective="first"),
        episode("e1", minutes=1, objective="second"),
        episode("e2", minutes=0),
        {**delete, "record_id": "e2"},  # written, then deleted: a tombstone
        {**delete, "record_id": "e3"},  # deleted before this device ever pushed it: then created
        episode("e3", minutes=4, objective="created after its delete"),
    ]
    body = push(client, ops).json()
    assert body["synced"] == len(ops) and body["conflicts"] == []
    assert [a["record_id"] for a in body["acknowledged_operations"]] == [op["record_id"] for op in ops]
    rows = {m.record_id: m for m in memories_of(account["stack"])}
    assert rows["e1"].data["objective"] == "second" and rows["e1"].client_updated_at == T0 + timedelta(minutes=1)
    assert rows["e2"].deleted_at is not None
    assert rows["e3"].deleted_at is None and rows["e3"].data["objective"] == "created after its delete"
    assert sorted(op["record_id"] for op in pull(client, omit_since=True).json()["operations"]) == ["e1", "e3"]
    assert Stack.objects.get(pk=account["stack"].pk).memory_count == 2


def test_nothing_is_acknowledged_or_stored_when_the_push_cannot_commit(account: dict[str, Any],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Acknowledgement comes after commit: a failure after the rows were written (here: updating the
    stack's counters) rolls the whole push back, and the client gets no acknowledgement to act on."""
    from memories.sync import engine

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise DatabaseError("simulated failure before commit")

    monkeypatch.setattr(engine, "finish_set", refuse)
    client = account["client"]
    client.raise_request_exception = False
    response = push(client, [episode("e1"), value_op("v1")])
    assert response.status_code >= 500
    assert b"acknowledged_operations" not in response.content
    assert memories_of(account["stack"]) == []
    assert MemoryRevision.objects.count() == 0


def test_older_clients_insert_upsert_and_legacy_is_forgotten(account: dict[str, Any]) -> None:
    """§3.6 and §3.7: `insert` / `upsert` mean upsert; the legacy `is_forgotten: true`
    forgets like kernle 0.15.0's `strength: 0.0`, and the forgotten record is left out of pulls."""
    client = account["client"]
    body = push(client, [{**episode("e1"), "operation": "insert"}, {**episode("e2"), "operation": "UPSERT"},
                         episode("e3")]).json()
    assert body["synced"] == 3 and body["conflicts"] == []
    body = push(client, [episode("e3", minutes=1, is_forgotten=True, forgotten_reason="user")]).json()
    assert body["synced"] == 1
    memory = Memory.objects.get(record_id="e3")
    assert memory.forgotten_at is not None and memory.forgotten_reason == "client_forget"
    assert sorted(op["record_id"] for op in pull(client, omit_since=True).json()["operations"]) == ["e1", "e2"]


def test_null_timestamps_fall_back_as_the_protocol_says(account: dict[str, Any]) -> None:
    """§3.7: data.local_updated_at null -> the op-level time; both null -> server
    time; created_at null -> server time. Pulled records always carry aware timestamps."""
    op_level = episode("e1", minutes=3)
    op_level["data"].update(local_updated_at=None, created_at=None)
    neither = episode("e2")
    neither["local_updated_at"] = None
    neither["data"].update(local_updated_at=None, created_at=None)
    before = datetime.now(UTC) - timedelta(seconds=5)
    assert push(account["client"], [op_level, neither]).json()["synced"] == 2
    rows = {m.record_id: m for m in memories_of(account["stack"])}
    assert rows["e1"].client_updated_at == T0 + timedelta(minutes=3)
    assert rows["e2"].client_updated_at is not None and rows["e2"].client_updated_at >= before
    assert rows["e1"].created_at >= before and rows["e2"].created_at >= before
    for op in pull(account["client"], omit_since=True).json()["operations"]:
        for key in ("created_at", "local_updated_at", "cloud_synced_at"):
            assert datetime.fromisoformat(op["data"][key]).tzinfo is not None


def test_the_clients_stack_id_alphabet_is_accepted() -> None:
    """§1.3: 1-100 characters, mixed case, dots allowed; the stack is provisioned on first push."""
    stack_id = "My.Agent_Stack-2"
    reg = personal_account_register(stack_id="acceptance", email=f"{uuid.uuid4().hex[:8]}@example.test")
    Organization.objects.filter(pk=reg.organization.pk).update(tier="enterprise")  # room for a second stack
    client = bearer_client(make_key(reg.organization, user=reg.user)[1])  # an unbound key of the account
    response = push(client, [episode("e1")], stack_id=stack_id)
    assert response.status_code == 200 and response.json()["synced"] == 1, response.content
    assert Stack.objects.filter(organization=reg.organization, slug=stack_id).exists()
    assert [op["record_id"] for op in pull(client, stack_id=stack_id, omit_since=True).json()["operations"]] == ["e1"]


# --- whole-request limits: the operation cap and `since` (§3.2, §4.1, §7.3) -----------------------------

def test_a_push_over_the_operation_cap_is_413_and_stores_nothing(account: dict[str, Any]) -> None:
    """The cap is the native push's (1,000): kernle==0.15.0 sends at most that (100 per `sync push`,
    1,000 per `sync full`), so only a client past what the real one sends is refused, as a whole."""
    assert push(account["client"], [episode("kept")]).json()["synced"] == 1
    over = push(account["client"], [episode(f"e{i}") for i in range(1001)] + [
        {"operation": "delete", "table": "episodes", "record_id": "kept"}])
    assert over.status_code == 413, over.content
    error = over.json()["error"]
    assert error["code"] == "too_many_operations"
    assert error["fields"]["max_operations"] == 1000 and error["fields"]["received"] == 1002
    assert "1,000" in over.json()["detail"]
    # The CLI prints the first 200 characters of a refused push: the reason fits in them.
    assert "too_many_operations" in over.content.decode()[:200] and "1,000" in over.content.decode()[:200]
    assert [m.record_id for m in memories_of(account["stack"])] == ["kept"]
    assert Memory.objects.get(record_id="kept").deleted_at is None


def test_sixty_thousand_tiny_operations_are_refused_before_any_work(account: dict[str, Any]) -> None:
    tiny = [{"operation": "delete", "table": "notes", "record_id": f"n{i}"} for i in range(60_000)]
    response = push(account["client"], tiny)
    assert response.status_code == 413
    assert response.json()["error"]["fields"]["received"] == 60_000
    assert push(account["client"], tiny[:1000]).json()["synced"] == 1000  # the cap itself is accepted


@pytest.mark.parametrize("since", ["not-a-date", "", "2026-13-45T99:99:99", "9999-12-31T23:59:59-23:00", 12345,
                                   True, ["2026-11-21T23:00:00+00:00"], {"at": "2026-11-21T23:00:00+00:00"}])
def test_an_unreadable_since_is_400_naming_since_not_a_full_pull(account: dict[str, Any], since: Any) -> None:
    assert push(account["client"], [episode("e1")]).json()["synced"] == 1
    watermarks = SyncWatermark.objects.count()
    response = pull(account["client"], since=since)
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "invalid_since"
    assert list(response.json()["error"]["fields"]) == ["since"]
    assert SyncWatermark.objects.count() == watermarks  # nothing recorded as pulled


@pytest.mark.parametrize("since", ["2026-11-21T23:15:58.099442+00:00", "2026-11-21T23:15:58Z", "2026-11-21 23:15:58",
                                   None])
def test_every_since_the_client_sends_is_read(account: dict[str, Any], since: str | None) -> None:
    """What kernle sends: `datetime.isoformat()` of its clock (aware), nothing, or null (`sync full`)."""
    assert push(account["client"], [episode("e1")]).json()["synced"] == 1
    response = pull(account["client"], since=since)
    assert response.status_code == 200, response.content
    assert [op["record_id"] for op in response.json()["operations"]] == ["e1"]
