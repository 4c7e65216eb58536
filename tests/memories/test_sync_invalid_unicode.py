"""One operation with text that is not valid Unicode is that operation's conflict; the rest of the
push is stored.

JSON may spell a lone UTF-16 surrogate (`"\\ud800"`): it parses to a Python str that UTF-8 (and so
Postgres) cannot carry. A client that sends one must not have its whole batch refused — it would
retry the same batch forever. The bodies below are sent as the bytes a client puts on the wire
(`json.dumps` escapes the surrogate), through the real parser, engine and database.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from accounts.throttles import throttle_state_clear
from memories.models import Memory
from stacks.services import personal_account_register
from tests.factories import bearer_client, make_key, make_org, make_stack

pytestmark = pytest.mark.django_db

LONE = "\ud800"  # a lone high surrogate: valid JSON escape, invalid Unicode text
WHEN = "2026-11-21T23:00:00+00:00"


@pytest.fixture(autouse=True)
def fresh_throttles() -> Iterator[None]:
    throttle_state_clear()
    yield


def _post(client: Any, path: str, body: dict[str, Any]) -> Any:
    raw = json.dumps(body)  # ensure_ascii: the surrogate travels as the six characters \ud800
    assert "\\ud800" in raw
    return client.post(path, data=raw, content_type="application/json")


def _note(record_id: str, **data: Any) -> dict[str, Any]:
    fields = {"content": f"Fractions need common denominators ({record_id})", "tags": ["math"],
              "local_updated_at": WHEN, **data}
    return {"operation": "update", "table": "notes", "record_id": record_id, "local_updated_at": WHEN,
            "version": 1, "data": fields}


# Every place a lone surrogate can hide in one kernle operation.
KERNLE_BAD = {
    "in a text field": _note("bad-content", content="half " + LONE),
    "in a list item": _note("bad-tag", tags=["math", "x" + LONE]),
    "in a provenance list": _note("bad-derived", derived_from=[LONE]),
    "in an unknown field": _note("bad-extra", remark={"deep": [LONE]}),
    "in an unknown field's name": _note("bad-key", **{"k" + LONE: 1}),
    "in a passthrough field": _note("bad-context", context=LONE),
    "in the record id": _note("bad-id-" + LONE),
    "in the table name": {**_note("bad-table"), "table": "notes" + LONE},
    "in the operation": {**_note("bad-op"), "operation": "update" + LONE},
}


@pytest.fixture
def kernle_account() -> dict[str, Any]:
    reg = personal_account_register(stack_id="acceptance", email=f"{uuid.uuid4().hex[:8]}@example.test")
    return {"client": bearer_client(reg.secret), "stack": reg.stack}


@pytest.mark.parametrize("where", sorted(KERNLE_BAD))
def test_kernle_push_with_one_invalid_unicode_op_stores_the_valid_ones(kernle_account: dict[str, Any],
                                                                      where: str) -> None:
    ops = [_note("good-1"), KERNLE_BAD[where], _note("good-2")]
    response = _post(kernle_account["client"], "/sync/push", {"stack_id": "acceptance", "operations": ops})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["synced"] == 2
    # The refused one is acknowledged as well, so the client stops re-sending it (its conflict log
    # keeps the refusal): docs/kernle-protocol.md §3.11.
    acknowledged = [a["record_id"] for a in body["acknowledged_operations"]]
    assert acknowledged[0] == "good-1" and acknowledged[2] == "good-2" and len(acknowledged) == 3
    assert len(body["conflicts"]) == 1
    conflict = body["conflicts"][0]
    assert conflict["error"]
    assert LONE not in json.dumps(conflict, ensure_ascii=False)  # echoed names are made printable
    stored = sorted(Memory.objects.filter(stack=kernle_account["stack"]).values_list("record_id", flat=True))
    assert stored == ["good-1", "good-2"]


def test_kernle_conflict_says_the_text_is_not_valid_unicode(kernle_account: dict[str, Any]) -> None:
    ops = [_note("good-1"), KERNLE_BAD["in a text field"]]
    body = _post(kernle_account["client"], "/sync/push", {"stack_id": "acceptance", "operations": ops}).json()
    assert body["conflicts"] == [{"table": "notes", "record_id": "bad-content", "operation": "update",
                                  "error": body["conflicts"][0]["error"]}]
    assert "unicode" in body["conflicts"][0]["error"].lower() and "content" in body["conflicts"][0]["error"]


def test_retrying_the_same_push_converges(kernle_account: dict[str, Any]) -> None:
    """The client's retry of the same batch gets the same answer and changes nothing."""
    ops = [_note("good-1"), KERNLE_BAD["in a list item"], _note("good-2")]

    def stored() -> dict[str, tuple[int, int]]:
        rows = Memory.objects.filter(stack=kernle_account["stack"]).values_list("record_id", "version",
                                                                                "change_seq")
        return {record_id: (version, change_seq) for record_id, version, change_seq in rows}

    first = _post(kernle_account["client"], "/sync/push", {"stack_id": "acceptance", "operations": ops}).json()
    before = stored()
    again = _post(kernle_account["client"], "/sync/push", {"stack_id": "acceptance", "operations": ops}).json()
    assert again["synced"] == first["synced"] == 2 and again["conflicts"] == first["conflicts"]
    assert sorted(before) == ["good-1", "good-2"] and stored() == before


def test_native_push_with_one_invalid_unicode_op_stores_the_valid_ones() -> None:
    org = make_org()
    stack = make_stack(org, "student-1")
    _, secret = make_key(org, stack=stack)
    ops = [
        {"op": "upsert", "kind": "note", "record_id": "n1", "data": {"content": "Common denominators"}},
        {"op": "upsert", "kind": "note", "record_id": "n2", "data": {"content": "bad " + LONE}},
        {"op": "upsert", "kind": "note" + LONE, "record_id": "n3", "data": {"content": "ok"}},
        {"op": "upsert", "kind": "note", "record_id": "n4" + LONE, "data": {"content": "ok"}},
        {"op": "upsert", "kind": "belief", "record_id": "b1", "data": {"statement": "Practice helps",
                                                                      "extra_" + LONE: True}},
        {"op": "upsert", "kind": "note", "record_id": "n5", "data": {"content": "Also fine"}},
    ]
    response = _post(bearer_client(secret), "/api/v1/stacks/student-1/sync/push", {"operations": ops})
    assert response.status_code == 200, response.content
    body = response.json()
    assert [r["status"] for r in body["results"]] == ["applied", "rejected", "rejected", "rejected", "rejected",
                                                      "applied"]
    assert body["results"][1]["error"]["code"] == "invalid" and "content" in body["results"][1]["error"]["fields"]
    assert body["applied"] == 2 and body["rejected"] == 4
    assert sorted(Memory.objects.filter(stack=stack).values_list("record_id", flat=True)) == ["n1", "n5"]
