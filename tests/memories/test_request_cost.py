"""What one agent request costs the database: round trips per operation of the soak's mix (issue 19).

Budgets, measured on a warm request (the key verified once before): the key lookup is remembered
(accounts/key_cache.py) and a kernle pull records its watermark with one upsert. A new query on
these paths should be a decision, not an accident: raise a budget here with the reason.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.factories import bearer_client, make_key, make_org, make_stack

pytestmark = pytest.mark.django_db(transaction=True)

STACK = "agent-000"
# operation: most queries (BEGIN / COMMIT / SAVEPOINT included) a warm request may take
BUDGETS = {"push of 10": 9, "pull": 8, "load": 7, "write": 11}


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


@pytest.mark.parametrize("operation", ["push of 10", "pull", "search", "load", "write"])
def test_a_warm_request_stays_within_its_round_trips(calls: dict[str, Callable[[], Any]], operation: str) -> None:
    call = calls[operation]
    assert call().status_code in (200, 201)  # warm: the key verified, the pull's watermark exists
    with CaptureQueriesContext(connection) as queries:
        response = call()
    assert response.status_code in (200, 201), response.content
    statements = [q["sql"] for q in queries]
    assert not [s for s in statements if 'FROM "accounts_apikey"' in s], "the verified key was looked up again"
    if operation in BUDGETS:  # (search's own SQL is memories.search's budget, not this path's)
        assert len(statements) <= BUDGETS[operation], "\n".join(s[:160] for s in statements)
