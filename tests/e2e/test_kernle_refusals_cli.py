"""Every refusal MemoryHub gives a push drains the real kernle 0.15.0 CLI's queue (docs/kernle-protocol.md
§3.11, §4.6).

kernle keeps an operation queued until the server acknowledges it, and `sync push` re-sends what is
queued on every run, without counting. So each refusal must be acknowledged (and named in
`conflicts`, which the CLI writes to its conflict log), or the device re-sends it for ever.

The device's queue is the client's own SQLite store: the bad records are written into its
`sync_queue` (the payload the CLI sends), as a buggy or older client version would leave them.
Round 1: a value out of range, a text over the length limit (and one over the JSON string bound),
a secret redaction refuses and a table MemoryHub does not sync, next to a good note, a relationship
without its types and a drive without `drive_type` (stored). Round 2: the server forgets one
memory, deletes one, purges one by its TTL and erases one; the device re-pushes its old copies and
nothing comes back. Round 3: the storage quota. Round 4: the stack limit, from a second device on a
second stack. After each round the queue is empty and a second `sync push` has nothing to send.

Text that is not valid Unicode cannot come from this client: its HTTP library encodes the body as
UTF-8 and fails on a lone surrogate before sending (tests/memories/test_sync_invalid_unicode.py
covers the server's answer).
"""

from __future__ import annotations

import json
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from accounts.models import Membership
from memories.lifecycle.ttl import ttl_purge
from memories.models import Memory
from stacks.models import Stack
from tests.accounts.clients import csrf_session_client
from tests.factories import bearer_client, make_user

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SLUG = "refusals"
# Queue rows written into the device's own store, as the CLI itself writes them (payload first).
QUEUE_SNIPPET = r'''
import json, os, sys
from datetime import datetime, timezone
from kernle import Kernle

store = Kernle(stack_id=os.environ["KERNLE_STACK_ID"])._storage
now = datetime.now(timezone.utc).isoformat()
with store._connect() as conn:
    for row in json.load(sys.stdin):
        payload = json.dumps(row["payload"])
        conn.execute("INSERT INTO sync_queue (table_name, record_id, operation, data, local_updated_at, synced, "
                     "payload, queued_at) VALUES (?, ?, 'upsert', ?, ?, 0, ?, ?)",
                     (row["table"], row["record_id"], payload, now, payload, now))
print("pending:", store.get_pending_sync_count())
'''
PRIVATE_KEY = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA7Yk3q9\n-----END RSA PRIVATE KEY-----"


def _note(record_id: str, content: str) -> dict[str, Any]:
    return {"table": "notes", "record_id": record_id,
            "payload": {"id": record_id, "stack_id": SLUG, "content": content, "note_type": "note", "tags": []}}


def _out(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit={result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


class Device:
    """One kernle device (a data directory) on one stack; registers, or signs in with `key`."""

    def __init__(self, kernle: Any, server: str, *, stack: str = SLUG, key: str | None = None) -> None:
        self.kernle, self.stack = kernle, stack
        self.dir: Path = kernle.new_data_dir()
        joined = (self.run("auth", "login", "--api-key", key, "--backend-url", server, "--json") if key else
                  self.run("auth", "register", "--email", "refusals@example.test", "--backend-url", server, "--json"))
        assert joined.returncode == 0, _out(joined)
        self.key: str = kernle.credentials(self.dir)["api_key"]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.kernle.run(*args, data_dir=self.dir, stack=self.stack, timeout=180)

    def queue(self, rows: list[dict[str, Any]]) -> None:
        done = subprocess.run([str(self.kernle.python), "-c", QUEUE_SNIPPET], input=json.dumps(rows),
                              env=self.kernle.env(self.dir, stack=self.stack), cwd=self.dir, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0 and "pending:" in done.stdout, done.stdout + done.stderr

    def pending(self) -> int:
        status: dict[str, Any] = self.kernle.json(self.run("sync", "status", "--json"))
        return int(status["pending_operations"])

    def push_and_drain(self) -> dict[str, Any]:
        """One `sync push`; then the queue is empty and the next push has nothing to send."""
        pushed = self.run("sync", "push", "--json")
        assert pushed.returncode == 0, _out(pushed)
        result: dict[str, Any] = self.kernle.json(pushed)
        assert self.pending() == 0, result
        again = self.run("sync", "push")
        assert again.returncode == 0 and "No pending changes" in again.stdout, _out(again)
        return result

    def conflict_log(self) -> str:
        listed = self.run("sync", "conflicts", "--json")
        assert listed.returncode == 0, _out(listed)
        return listed.stdout


def _refused(result: dict[str, Any]) -> dict[str, str]:
    return {str(c["record_id"]): str(c["error"]) for c in result["conflicts"]}


def test_every_refusal_drains_the_real_clients_queue(kernle: Any, kernle_server: str) -> None:
    device = Device(kernle, kernle_server)

    # Round 1: records the server refuses, beside records it stores.
    device.queue([
        _note("n-good", "Fractions click with pizza diagrams"),
        {"table": "beliefs", "record_id": "b-range",
         "payload": {"id": "b-range", "stack_id": SLUG, "statement": "Homework helps", "confidence": 7}},
        _note("n-long", "x" * 25_000),
        _note("n-huge", "y" * 1_500_000),  # over the JSON string bound of every other route
        _note("n-secret", f"My key is {PRIVATE_KEY}"),
        {"table": "relationships", "record_id": "r-untyped",
         "payload": {"id": "r-untyped", "stack_id": SLUG, "entity_name": "Ms. Rivera"}},
        {"table": "drives", "record_id": "d-nokey", "payload": {"id": "d-nokey", "stack_id": SLUG, "intensity": 0.4}},
        {"table": "trust_assessments", "record_id": "t-local", "payload": {"id": "t-local", "stack_id": SLUG}},
    ])
    assert device.pending() == 8
    first = device.push_and_drain()
    refused = _refused(first)
    assert set(refused) == {"b-range", "n-long", "n-huge", "n-secret", "t-local"}, first
    assert refused["t-local"] == "unsupported table"
    assert "confidence" in refused["b-range"] and "content" in refused["n-long"]
    assert PRIVATE_KEY not in json.dumps(first)
    stack = Stack.objects.get(slug=SLUG)
    stored = {m.record_id: m for m in Memory.objects.filter(stack=stack)}
    assert set(stored) == {"n-good", "r-untyped", "d-nokey"}
    assert stored["r-untyped"].data["relationship_type"] == "interaction"
    log = device.conflict_log()
    assert "b-range" in log and "n-long" in log and "n-secret" in log and "backend_rejected" in log

    # Round 2: the server forgets, deletes, purges and erases; the device re-pushes its old copies.
    device.queue([_note(rid, f"Old copy of {rid}") for rid in ("n-forget", "n-delete", "n-purge", "n-erase")])
    device.push_and_drain()
    server = {m.record_id: m for m in Memory.objects.filter(stack=stack)}
    api = bearer_client(device.key)
    base = f"/api/v1/stacks/{SLUG}"
    assert api.post(f"{base}/memories/{server['n-forget'].pk}/forget", {"reason": "parent asked"},
                    format="json").status_code == 200
    deleted = api.post(f"{base}/sync/push", {"operations": [{"op": "delete", "kind": "note", "record_id": "n-delete"}]},
                       format="json")
    assert deleted.status_code == 200 and deleted.json()["applied"] == 1
    Memory.objects.filter(pk=server["n-purge"].pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert ttl_purge().counts["purged"] == 1
    # Erasure is an admin's act: the account's own admin, signed in.
    admin = csrf_session_client(make_user(stack.organization, role=Membership.Role.ADMIN))
    erased = admin.post(f"{base}/memories/{server['n-erase'].pk}/erase", {"requested_by": "the student"},
                        format="json")
    assert erased.status_code == 200, erased.content

    device.queue([_note(rid, f"Edited again: {rid}") for rid in ("n-forget", "n-delete", "n-purge", "n-erase")])
    second = device.push_and_drain()
    assert set(_refused(second)) == {"n-purge", "n-erase"}, second
    after = {m.record_id: m for m in Memory.objects.filter(stack=stack)}
    assert after["n-forget"].forgotten_at is not None and after["n-delete"].deleted_at is not None
    assert "n-purge" not in after and "n-erase" not in after
    assert after["n-forget"].data["content"] == "Old copy of n-forget"

    # Round 3: the storage quota (free: 10 MB), refused per record and acknowledged all the same.
    Stack.objects.filter(pk=stack.pk).update(bytes_used=10 * 1024 * 1024 - 10)
    device.queue([_note("n-over", "One note too many for the free tier")])
    third = device.push_and_drain()
    assert "storage quota exceeded" in _refused(third)["n-over"]
    assert not Memory.objects.filter(stack=stack, record_id="n-over").exists()

    # Round 4: the stack limit (free: one syncing stack), for a second stack of the same account.
    Stack.objects.filter(pk=stack.pk).update(bytes_used=0)
    created = device.run("auth", "keys", "create", "--name", "second-device", "--json")
    assert created.returncode == 0, _out(created)
    unbound: str = kernle.json(created)["key"]  # an account key, bound to no stack: it may provision one
    other = Device(kernle, kernle_server, stack="refusals-two", key=unbound)
    other.queue([{"table": "notes", "record_id": "n-two",
                  "payload": {"id": "n-two", "stack_id": "refusals-two", "content": "A second stack's first note"}}])
    fourth = other.push_and_drain()
    assert "stack limit reached" in _refused(fourth)["n-two"]
    assert not Stack.objects.filter(slug="refusals-two").exists()
