"""How a push finds the stored records it names, on small and on large stacks.

Over a large stack a push probes the unique (stack, kind, record_id) index once per key, after
checking the probe's plan (and refreshing stale statistics if the planner would scan the stack
instead); over a small one it joins. Whichever way the rows are found, the outcome of a push is the
same: these tests run the same pushes through every path and compare what is stored.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import pytest
from django.core.cache import cache
from django.db import connection

from accounts.throttles import throttle_state_clear
from memories.models import Memory, MemoryRevision
from memories.sync import lookup as sync
from memories.writes.columns import array_literal
from stacks.models import Stack
from stacks.services import personal_account_register
from tests.factories import bearer_client, other_connection

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 21, 23, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def fresh_state() -> Iterator[None]:
    throttle_state_clear()
    cache.delete(sync._ANALYZE_CACHE_KEY)
    sync._probe_trusted_until.clear()
    yield
    sync._probe_trusted_until.clear()


def note(record_id: str, minutes: float, content: str, tags: list[str]) -> dict[str, Any]:
    stamp = (T0 + timedelta(minutes=minutes)).isoformat()
    return {"operation": "update", "table": "notes", "record_id": record_id, "local_updated_at": stamp,
            "version": 1, "data": {"id": record_id, "content": content, "tags": tags, "local_updated_at": stamp,
                                   "created_at": stamp, "version": 1}}


class Stored(NamedTuple):
    content: str
    tags: list[str]
    version: int
    deleted: bool


def run_pushes(*, large: bool) -> dict[str, Any]:
    """A sequence of pushes covering new, updated, stale, re-sent and deleted records; returns
    what ended up stored."""
    reg = personal_account_register(stack_id="acceptance", email=f"{uuid.uuid4().hex[:8]}@example.test")
    client = bearer_client(reg.secret)

    def push(operations: list[dict[str, Any]]) -> dict[str, Any]:
        if large:
            # The stack's own counter decides the path; pretend it is large without writing 2,000 rows.
            Stack.objects.filter(pk=reg.stack.pk).update(memory_count=sync._PROBE_CHECK_MIN_ROWS + 10_000)
        response = client.post("/sync/push", {"stack_id": "acceptance", "operations": operations}, format="json")
        assert response.status_code == 200, response.content
        body: dict[str, Any] = response.json()
        return body

    first = [note(f"n{i}", 0, f"note {i}", ["a"]) for i in range(5)]
    push(first)
    push(first)  # re-sent: nothing changes
    push([note("n1", 10, "edited", ["b"]), note("n2", -5, "stale", ["c"]), note("n9", 1, "new", []),
          {"operation": "delete", "table": "notes", "record_id": "n3", "local_updated_at": T0.isoformat()}])
    last = push([note("n3", 20, "after delete", ["d"])])  # a tombstone is not resurrected
    rows = {m.record_id: Stored(m.data["content"], sorted(m.tags), m.version, m.deleted_at is not None)
            for m in Memory.objects.filter(stack=reg.stack)}
    return {"rows": rows, "revisions": MemoryRevision.objects.filter(memory__stack=reg.stack).count(),
            "last": {k: v for k, v in last.items() if k != "server_time"}}


def test_a_push_to_a_large_stack_stores_exactly_what_one_to_a_small_stack_does() -> None:
    small = run_pushes(large=False)
    large = run_pushes(large=True)
    assert small == large
    assert small["rows"]["n1"] == ("edited", ["a", "b"], 2, False)
    assert small["rows"]["n2"] == ("note 2", ["a", "c"], 2, False)  # the newer copy kept, lists unioned
    assert small["rows"]["n3"].deleted is True and small["rows"]["n9"] == ("new", [], 1, False)


@pytest.mark.parametrize("probe", [True, False])
def test_both_lookup_queries_find_the_same_rows(probe: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sync, "_probe_is_safe", lambda stack, params: probe)
    expected = run_pushes(large=False)
    assert run_pushes(large=True) == expected


@pytest.mark.parametrize("probe", [True, False])
def test_the_lookup_reads_every_stored_field_as_the_orm_does(probe: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sync, "_probe_is_safe", lambda stack, params: probe)
    reg = personal_account_register(stack_id="fields", email="fields@example.test")
    response = bearer_client(reg.secret).post("/sync/push", {"stack_id": "fields", "operations": [
        note("n0", 0, "fractions with a ruler", ["quiz", "maths"]), note("n1", 1, "pizza slices", [])]}, format="json")
    assert response.status_code == 200, response.content
    stack = Stack.objects.get(pk=reg.stack.pk)
    stack.memory_count = sync._PROBE_CHECK_MIN_ROWS if probe else 0
    found = sync._lookup_existing(stack, {("note", "n0"), ("note", "n1"), ("note", "never-pushed")})
    assert sorted(memory.record_id for memory in found) == ["n0", "n1"]
    deferred = {"embedding", "search_vector"}

    def values(memory: Memory) -> dict[str, Any]:
        return {field.attname: getattr(memory, field.attname) for field in Memory._meta.concrete_fields
                if field.name not in deferred}

    for memory in found:
        assert memory.get_deferred_fields() == deferred and not memory._state.adding
        assert values(memory) == values(Memory.objects.defer(*deferred).get(pk=memory.pk))
    assert next(m for m in found if m.record_id == "n0").data["content"] == "fractions with a ruler"


def _hold_the_statistics_lock() -> None:
    """Take the lock ANALYZE needs (SHARE UPDATE EXCLUSIVE) in the test's own transaction, waiting
    for whoever holds it now. The refresh gives up after 50 ms behind another holder — on a busy
    machine, autovacuum analysing the same table, which is what made the test below flaky — but a
    lock the transaction already holds never blocks its own ANALYZE, and nobody else can take it
    until the test ends. Taken before the test writes, so a concurrent index build cannot deadlock
    with it."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL lock_timeout = '60s'")
        cursor.execute("LOCK TABLE memories_memory IN SHARE UPDATE EXCLUSIVE MODE")


def test_the_probe_check_gives_the_table_statistics_and_trusts_only_a_safe_plan() -> None:
    _hold_the_statistics_lock()
    reg = personal_account_register(stack_id="acceptance", email=f"{uuid.uuid4().hex[:8]}@example.test")
    stack = Stack.objects.get(pk=reg.stack.pk)
    params = [array_literal(["note"]), array_literal(["n1"]), stack.pk]
    Memory.objects.bulk_create([Memory(stack=stack, kind="note", record_id=f"x{i}", created_at=T0,
                                       server_updated_at=T0, data={"content": "x"}) for i in range(50)])
    safe = sync._probe_is_safe(stack, params)
    # Without statistics the table is analysed first (allowed once a minute); a plan found safe
    # with statistics is trusted for a while, an unsafe one never is.
    assert sync._has_statistics()
    assert (stack.pk in sync._probe_trusted_until) == safe
    assert sync._probe_is_safe(stack, params) == safe


def test_a_statistics_refresh_never_waits_behind_another_holder_of_the_lock() -> None:
    """Another session analysing the table (autovacuum, say): the refresh gives up at once and
    reports "not refreshed", and a push still stores what it is sent (the lookup joins)."""
    other = other_connection()
    try:
        other.execute("LOCK TABLE memories_memory IN SHARE UPDATE EXCLUSIVE MODE")
        started = time.monotonic()
        assert sync._refresh_statistics() is False
        assert time.monotonic() - started < 5  # 50 ms lock timeout, not a wait for the other session
    finally:
        other.rollback()
        other.close()


@pytest.mark.parametrize(("has_statistics", "plans_well", "refresh_fixes", "safe", "trusted"), [
    (True, [True], False, True, True),              # a good plan seen with statistics: trusted a while
    (False, [True], False, True, False),            # good, but without statistics: used, checked again
    (True, [False, False], False, False, False),    # a bad plan that a refresh cannot fix: the join
    (True, [False, True], True, True, True),        # stale statistics refreshed, then a good plan
])
def test_the_probe_trust_policy(monkeypatch: pytest.MonkeyPatch, has_statistics: bool, plans_well: list[bool],
                                refresh_fixes: bool, safe: bool, trusted: bool) -> None:
    """Which plan check outcome leads to the probe, and which is remembered (planner facts given)."""
    reg = personal_account_register(stack_id="acceptance", email=f"{uuid.uuid4().hex[:8]}@example.test")
    plans = iter(plans_well)
    monkeypatch.setattr(sync, "_has_statistics", lambda: has_statistics)
    monkeypatch.setattr(sync, "_probe_planned_well", lambda params: next(plans))
    monkeypatch.setattr(sync, "_refresh_statistics", lambda: refresh_fixes)
    assert sync._probe_is_safe(reg.stack, []) is safe
    assert (reg.stack.pk in sync._probe_trusted_until) is trusted
    if trusted:  # the next batch asks nothing of the planner
        monkeypatch.setattr(sync, "_probe_planned_well", lambda params: pytest.fail("plan checked again"))
        assert sync._probe_is_safe(reg.stack, []) is True


def test_plan_reader_finds_an_index_anywhere_in_the_plan() -> None:
    plan = [{"Plan": {"Node Type": "Nested Loop", "Plans": [
        {"Node Type": "Function Scan"},
        {"Node Type": "Limit", "Plans": [{"Node Type": "Index Scan", "Index Name": sync._UNIQUE_INDEX}]}]}}]
    assert sync._plan_uses(plan, sync._UNIQUE_INDEX)
    assert not sync._plan_uses(plan, "memories_stack_kind_created")
