"""What one agent request costs the database: round trips per operation of the soak's mix.

Budgets, measured on a warm request (the key verified once before): the key lookup is remembered
(accounts/key_cache.py). A new query on these paths should be a decision, not an accident: raise a
budget here with the reason. What each operation sends now (BEGIN / COMMIT count; a COPY does not
pass through Django's cursor and is not counted):

* push of 10: BEGIN, the stack (access decision and lock), the clock read after the lock, the
  stored rows the batch names, [COPY], the counter UPDATE and the change event's INSERT as one
  query string, COMMIT — and a school on a capped tier reads its storage use;
* pull: the stack, then its share lock and one statement reading the clock, the credential's
  watermark and the change set with the watermark's upsert, as one query string (one implicit
  transaction: no BEGIN / COMMIT round trips);
* load: the stack, the checkpoint and the boot config in one query string, then two query strings
  that each run as one implicit transaction (candidates; access UPDATE + rows): no BEGIN / COMMIT
  round trips; and the access log's one INSERT, sent once the response is (docs/privacy.md
  "Access log");
* write: BEGIN, the stack (access decision and the write kernel's lock in one statement), the
  storage use (capped tier), the INSERT with the counters and the event as one query string,
  COMMIT — no savepoint.

The counts before these budgets were cut: docs/benchmarks.md "Figures behind code choices".
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from memories.models import ChangeEvent, Memory, SyncWatermark
from stacks.models import Stack
from tests.factories import bearer_client, make_key, make_org, make_stack

pytestmark = pytest.mark.django_db(transaction=True)

STACK = "agent-000"
# operation: most queries (BEGIN / COMMIT / SAVEPOINT included) a warm request may take
BUDGETS = {"push of 10": 7, "pull": 2, "load": 5, "write": 5}


def _ops(count: int) -> list[dict[str, Any]]:
    stamp = datetime.now(UTC).isoformat()
    ops = []
    for n in range(count):
        rid = str(uuid.uuid4())
        ops.append({"operation": "update", "table": "notes", "record_id": rid, "local_updated_at": stamp,
                    "version": 1, "data": {"id": rid, "stack_id": STACK, "content": f"fractions lesson {n}",
                                           "note_type": "note", "tags": ["quiz"], "created_at": stamp,
                                           "local_updated_at": stamp, "version": 1, "deleted": False}})
    return ops


@pytest.fixture
def calls() -> dict[str, Callable[[], Any]]:
    org = make_org()
    make_stack(org, slug=STACK)
    stack_key = make_key(org, stack=org.stacks.get(slug=STACK))[1]
    client = bearer_client(stack_key)
    client.post("/sync/push", {"stack_id": STACK, "operations": _ops(20)}, format="json")
    base = f"/api/v1/stacks/{STACK}"
    return {
        "push of 10": lambda: client.post("/sync/push", {"stack_id": STACK, "operations": _ops(10)}, format="json"),
        "pull": lambda: client.post("/sync/pull", {"stack_id": STACK, "since": datetime.now(UTC).isoformat()},
                                    format="json"),
        "search": lambda: client.post(f"{base}/search", {"query": "fractions quiz", "limit": 10}, format="json"),
        "load": lambda: client.get(f"{base}/load"),
        "write": lambda: client.post(f"{base}/memories", {"kind": "note", "content": "a quiz"}, format="json"),
    }


def _statements(call: Callable[[], Any]) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        response = call()
    assert response.status_code in (200, 201), response.content
    return [q["sql"] for q in queries]


@pytest.mark.parametrize("operation", ["push of 10", "pull", "search", "load", "write"])
def test_a_warm_request_stays_within_its_round_trips(calls: dict[str, Callable[[], Any]], operation: str) -> None:
    call = calls[operation]
    assert call().status_code in (200, 201)  # warm: the key verified, the pull's watermark exists
    statements = _statements(call)
    assert not [s for s in statements if 'FROM "accounts_apikey"' in s], "the verified key was looked up again"
    assert not [s for s in statements if s.startswith("SAVEPOINT")], "a savepoint on the hot path"
    if operation in BUDGETS:  # (search's own SQL is memories.search's budget, not this path's)
        assert len(statements) <= BUDGETS[operation], "\n".join(s[:160] for s in statements)


def test_a_write_moves_its_counters_and_records_its_event_in_one_round_trip(
        calls: dict[str, Callable[[], Any]]) -> None:
    for operation in ("push of 10", "write"):
        statements = _statements(calls[operation])
        [counters] = [s for s in statements if "memory_count = memory_count +" in s]
        assert "INSERT INTO memories_changeevent" in counters, operation
    # A single write's row goes in the same query string (a push's new rows go by COPY).
    assert [s for s in statements if "INSERT INTO memories_memory " in s] == [counters]
    stack = Stack.objects.get(slug=STACK)
    assert stack.memory_count == Memory.objects.filter(stack=stack, deleted_at__isnull=True).count() == 31
    # The writes' own events (the suite's worker may have stored vectors meanwhile: "embedded" events)
    events = ChangeEvent.objects.filter(stack=stack).exclude(action="embedded").order_by("seq")
    assert [len(e.memory_ids) for e in events] == [20, 10, 1]
    seqs = [e.seq for e in events]
    assert seqs == sorted(set(seqs))  # one seq each, in the order written


def test_a_pull_reads_clock_and_watermark_under_its_lock_and_records_the_new_watermark(
        calls: dict[str, Callable[[], Any]]) -> None:
    statements = _statements(calls["pull"])
    assert not [s for s in statements if s.strip() == "SELECT clock_timestamp()"]
    [start] = [s for s in statements if "FOR SHARE" in s]
    assert "clock_timestamp()" in start and "memories_syncwatermark" in start
    first = SyncWatermark.objects.get().pulled_at
    _statements(calls["pull"])
    assert SyncWatermark.objects.get().pulled_at > first  # the upsert riding on the change set's query


def test_the_one_statement_write_still_decides_access_and_stores_nothing_half_way() -> None:
    """The native write now takes the access decision inside its transaction (with the stack
    lock) and its duplicate check without a savepoint: every refusal still stores nothing."""
    school, other = make_org(), make_org()
    mine = make_stack(school, slug="mine")
    theirs = make_stack(other, slug="theirs")
    key = bearer_client(make_key(school, stack=mine)[1])
    school_key = bearer_client(make_key(school)[1])
    read_only = bearer_client(make_key(school, stack=mine, read_only=True)[1])
    note = {"kind": "note", "content": "fractions"}

    assert key.post("/api/v1/stacks/theirs/memories", note, format="json").status_code == 404
    assert school_key.post("/api/v1/stacks/theirs/memories", note, format="json").status_code == 404
    refused = read_only.post("/api/v1/stacks/mine/memories", note, format="json")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "read_only_key"

    first = key.post("/api/v1/stacks/mine/memories", {**note, "record_id": "n-1"}, format="json")
    assert first.status_code == 201
    duplicate = key.post("/api/v1/stacks/mine/memories", {**note, "record_id": "n-1"}, format="json")
    assert duplicate.status_code == 409 and duplicate.json()["error"]["code"] == "duplicate_record"
    after = key.post("/api/v1/stacks/mine/memories", {**note, "record_id": "n-2"}, format="json")
    assert after.status_code == 201  # the refused write left nothing behind, not even a poisoned connection

    for stack, count in ((mine, 2), (theirs, 0)):
        stack.refresh_from_db()
        assert Memory.objects.filter(stack=stack).count() == stack.memory_count == count
        # one event per stored write (not counting the suite worker's "embedded" ones)
        assert ChangeEvent.objects.filter(stack=stack).exclude(action="embedded").count() == count
