"""Erasure with a certificate (docs/architecture.md §9): a school admin erases a student's stack or one memory; nothing
of it is left in any table that references a stack or a memory, the certificate verifies (a tampered one
does not), old record ids cannot be pushed back, and nobody but a school admin may erase."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from memories.governance import erasure
from memories.models import ChangeEvent, ErasureCertificate, Memory, SyncWatermark
from memories.services import CheckpointInput, boot_config_set, checkpoint_save
from stacks.models import Stack
from tests.accounts.clients import csrf_session_client
from tests.actors import School, school_cast
from tests.factories import sql_value

SECRET_TEXT = "Ada-confided-the-pizza-story"
# The scale an erasure must handle. The first FILLED go through the real write paths (the sync push,
# the checkpoint and boot-config services); the rest are set-based copies of them (`_amplify`: an
# INSERT … SELECT per table, fast), since pushing 10,000 through the API would dominate the suite.
STACK_SIZE = 10_000
FILLED = 600
# Kept on purpose after a stack erasure: credentials and assignments (no content), the certificate and
# the id-only tombstones, the erasure's own change events (ids only; checked below). Any other table
# with a stack_id column must hold nothing of the stack.
KEPT_STACK_TABLES = {"accounts_apikey", "stacks_teacherassignment", "memories_erasurecertificate",
                     "memories_erasedrecord", "memories_changeevent"}


def _native_push(client: Any, slug: str, record_ids: list[str], *, text: str = SECRET_TEXT,
                 at: str = "2026-11-21T23:00:00+00:00") -> None:
    for start in range(0, len(record_ids), 1000):
        ops = [{"op": "upsert", "kind": "note", "record_id": rid, "updated_at": at,
                "data": {"content": f"{text} {rid}", "tags": ["math"]}} for rid in record_ids[start:start + 1000]]
        response = client.post(f"/api/v1/stacks/{slug}/sync/push", {"operations": ops}, format="json")
        assert response.status_code == 200, response.content
        assert response.json()["applied"] == len(ops)


def _fill(cast: School, stack: Stack, n: int, prefix: str) -> None:
    """n notes through the sync push (half of them changed once: a revision each), salience rows, a
    checkpoint history, boot config and a sync watermark: everything a stack holds."""
    _native_push(cast.admin_api, stack.slug, [f"{prefix}{i}" for i in range(n)])
    _native_push(cast.admin_api, stack.slug, [f"{prefix}{i}" for i in range(n // 2)], text=f"{SECRET_TEXT} v2",
                 at="2026-11-22T23:00:00+00:00")
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO memories_memorysalience (memory_id, salience, computed_at) "
                       "SELECT id, 0.5, now() FROM memories_memory WHERE stack_id = %s", [stack.pk])
    for step in ("one", "two"):
        checkpoint_save(stack=stack, checkpoint=CheckpointInput(task=f"{SECRET_TEXT} {step}"))
    boot_config_set(stack=stack, key="tutor_name", value=SECRET_TEXT)
    SyncWatermark.objects.create(stack=stack, credential_id=f"key-{prefix}", pulled_at="2026-11-21T23:00:00Z")


def _columns(table: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
                       "AND table_name = %s AND is_generated = 'NEVER' ORDER BY ordinal_position", [table])
        return [row[0] for row in cursor.fetchall()]


def _amplify(stack: Stack, total: int) -> None:
    """Copies of the stack's memories (new ids and record ids, every other column as stored: text,
    vectors, embeddings) up to `total`, each with a copy of a revision and a salience row, and the
    stack's counters set to match — one statement per table."""
    have = Memory.objects.filter(stack=stack).count()
    copies = -(-(total - have) // have)
    memory_cols = [c for c in _columns("memories_memory") if c not in ("id", "record_id", "change_seq")]
    revision_cols = [c for c in _columns("memories_memoryrevision") if c not in ("id", "memory_id")]
    cols, rcols = ", ".join(memory_cols), ", ".join(f"r.{c}" for c in revision_cols)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO memories_memory (id, record_id, {cols}) "  # noqa: S608 (column names from the catalogue)
            f"SELECT gen_random_uuid(), m.record_id || '-copy' || g, {cols} FROM memories_memory m, "
            "generate_series(1, %s) g WHERE m.stack_id = %s ORDER BY g, m.record_id LIMIT %s",
            [copies, stack.pk, total - have])
        cursor.execute(
            f"INSERT INTO memories_memoryrevision (memory_id, {', '.join(revision_cols)}) "  # noqa: S608
            f"SELECT m.id, {rcols} FROM memories_memory m JOIN memories_memory o "
            "ON o.stack_id = m.stack_id AND o.record_id = split_part(m.record_id, '-copy', 1) "
            "JOIN memories_memoryrevision r ON r.memory_id = o.id WHERE m.stack_id = %s "
            "AND m.record_id LIKE '%%-copy%%'", [stack.pk])
        cursor.execute("INSERT INTO memories_memorysalience (memory_id, salience, computed_at) "
                       "SELECT id, 0.5, now() FROM memories_memory m WHERE stack_id = %s AND NOT EXISTS "
                       "(SELECT 1 FROM memories_memorysalience s WHERE s.memory_id = m.id)", [stack.pk])
        cursor.execute("UPDATE stacks_stack SET memory_count = c, bytes_used = b FROM (SELECT count(*) c, "
                       "sum(size_bytes) b FROM memories_memory WHERE stack_id = %s) t WHERE id = %s",
                       [stack.pk, stack.pk])


def _tables_with(column: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT table_name FROM information_schema.columns WHERE table_schema = current_schema() "
                       "AND column_name = %s", [column])
        return sorted(row[0] for row in cursor.fetchall())


def _stack_rows(stack_id: int) -> dict[str, int]:
    return {table: sql_value(f'SELECT count(*) FROM "{table}" WHERE stack_id = %s', [stack_id])  # noqa: S608
            for table in _tables_with("stack_id") if table not in KEPT_STACK_TABLES}


def _memory_rows(memory_ids: list[Any]) -> dict[str, int]:
    return {table: sql_value(f'SELECT count(*) FROM "{table}" WHERE memory_id = ANY(%s)', [memory_ids])  # noqa: S608
            for table in _tables_with("memory_id")}


def _everything_of(stack: Stack) -> dict[str, int]:
    ids = list(Memory.objects.filter(stack=stack).values_list("id", flat=True))
    return _stack_rows(stack.pk) | {f"{table} by memory": n for table, n in _memory_rows(ids).items()}


@pytest.fixture
def cast(db: None) -> School:
    return school_cast()


def test_erasing_a_stack_leaves_nothing_of_it_and_a_certificate_that_verifies(cast: School, monkeypatch: Any) -> None:
    # Erased in this request, in batches of ERASE_BATCH (2,000: five of them); the Celery job that
    # takes stacks above ASYNC_THRESHOLD runs the same batches (test_a_large_stack_is_erased_by_the_worker…).
    monkeypatch.setattr(erasure, "ASYNC_THRESHOLD", 2 * STACK_SIZE)
    alice, bob = cast.stack, cast.other_stack
    _fill(cast, alice, FILLED, "a")
    _amplify(alice, STACK_SIZE)
    _fill(cast, bob, 50, "b")
    alice_ids = list(Memory.objects.filter(stack=alice).values_list("id", flat=True))
    bob_before = _everything_of(bob)
    before = _memory_rows(alice_ids)
    assert _stack_rows(alice.pk)["memories_memory"] == STACK_SIZE
    assert before["memories_memoryrevision"] > STACK_SIZE // 3 and before["memories_memorysalience"] == STACK_SIZE
    assert bob_before["memories_memory"] == 50

    response = cast.admin_api.post(cast.stack_url("erase"), {"requested_by": "parent of Alice, letter 2026-11-20",
                                                             "confirm": "alice"}, format="json")

    assert response.status_code == 200, response.content
    cert = response.json()
    assert cert["status"] == "done" and cert["scope"] == "stack" and cert["stack"] == "alice"
    assert cert["counts"]["memory:note"] == STACK_SIZE
    assert cert["counts"]["revisions"] == before["memories_memoryrevision"]
    assert sql_value("SELECT count(*) FROM memories_erasedrecord WHERE stack_id = %s", [alice.pk]) == STACK_SIZE
    assert cert["counts"]["salience_rows"] == STACK_SIZE and cert["counts"]["checkpoints"] == 2
    assert cert["counts"]["boot_config_entries"] == 1 and cert["counts"]["sync_watermarks"] == 1
    assert cert["requested_by"] == "parent of Alice, letter 2026-11-20" and cert["erased_by"] == cast.admin.email
    # Every table that references the stack or its memories: nothing left.
    assert set(_stack_rows(alice.pk).values()) == {0}
    assert set(_memory_rows(alice_ids).values()) == {0}
    assert set(ChangeEvent.objects.filter(stack=alice).values_list("action", flat=True)) == {"erase"}
    alice.refresh_from_db()
    assert (alice.status, alice.memory_count, alice.bytes_used) == ("archived", 0, 0)
    # The other student's stack is untouched.
    assert _everything_of(bob) == bob_before
    # Only counts and ids survive: no memory text in the audit log or the certificate.
    audit = sql_value("SELECT string_agg(metadata::text || action || target_id, ' ') FROM accounts_auditevent "
                      "WHERE organization_id = %s", [cast.org.pk])
    assert "stack.erased" in audit and SECRET_TEXT not in audit and SECRET_TEXT not in str(cert)
    # Erased memories are 404 everywhere.
    assert cast.admin_api.get(cast.stack_url(f"memories/{alice_ids[0]}")).status_code == 404

    # The certificate: JSON, printable, verifiable by anyone; a tampered copy fails.
    assert cast.admin_api.get(f"/api/v1/erasures/{cert['id']}").json() == cert
    page = cast.admin_api.get(f"/api/v1/erasures/{cert['id']}?format=html")
    assert page.status_code == 200 and b"parent of Alice" in page.content and cert["digest"].encode() in page.content
    # Styled by a file: the Content-Security-Policy refuses inline <style>.
    assert b"<style" not in page.content and b"css/certificate" in page.content
    anyone = type(cast.admin_api)()
    assert anyone.get(f"/api/v1/erasures/{cert['id']}/verify").json() == {"valid": True}
    assert anyone.post(f"/api/v1/erasures/{cert['id']}/verify", cert,
                       format="json").json() == {"valid": True}
    for field, value in (("counts", {**cert["counts"], "memory:note": STACK_SIZE - 1}), ("requested_by", "nobody"),
                         ("completed_at", "2030-01-01T00:00:00+00:00")):
        tampered = {**cert, field: value}
        assert anyone.post(f"/api/v1/erasures/{cert['id']}/verify", tampered,
                           format="json").json() == {"valid": False}, field
    ErasureCertificate.objects.filter(pk=cert["id"]).update(requested_by="someone else")
    assert anyone.get(f"/api/v1/erasures/{cert['id']}/verify").json() == {"valid": False}
    assert anyone.get("/api/v1/erasures/not-a-uuid/verify").status_code == 404


def _pushes_look_up_tombstones(cast: School, record_id: str) -> bool:
    with CaptureQueriesContext(connection) as queries:
        _native_push(cast.admin_api, cast.stack.slug, [record_id])
    return any("memories_erasedrecord" in query["sql"] for query in queries.captured_queries)


def test_an_old_device_cannot_push_erased_records_back(cast: School) -> None:
    alice = cast.stack
    _native_push(cast.admin_api, alice.slug, ["keep"])
    # A stack never erased from has no tombstones: a push does not look for them (Stack.has_erasures).
    assert not _pushes_look_up_tombstones(cast, "gone") and not Stack.objects.get(pk=alice.pk).has_erasures
    gone = Memory.objects.get(stack=alice, record_id="gone")

    response = cast.admin_api.post(cast.stack_url(f"memories/{gone.pk}/erase"),
                                   {"requested_by": "student, email 2026-11-20"}, format="json")

    assert response.status_code == 200, response.content
    assert response.json()["counts"]["memory:note"] == 1 and response.json()["memory_id"] == str(gone.pk)
    assert cast.admin_api.get(cast.stack_url(f"memories/{gone.pk}")).status_code == 404
    assert Stack.objects.get(pk=alice.pk).memory_count == 1
    assert Stack.objects.get(pk=alice.pk).has_erasures and _pushes_look_up_tombstones(cast, "new")
    # kernle re-push of the old record id (the agent's device still has it): a conflict, nothing stored.
    op = {"operation": "update", "table": "notes", "record_id": "gone", "local_updated_at": None, "version": 1,
          "data": {"id": "gone", "content": SECRET_TEXT, "note_type": "note", "created_at": None,
                   "local_updated_at": None}}
    pushed = cast.agent.post("/sync/push", {"stack_id": alice.slug, "operations": [op]}, format="json")
    assert pushed.status_code == 200, pushed.content
    assert pushed.json()["synced"] == 0 and len(pushed.json()["conflicts"]) == 1
    native = cast.admin_api.post(cast.stack_url("sync/push"), {"operations": [
        {"op": "upsert", "kind": "note", "record_id": "gone", "data": {"content": SECRET_TEXT}}]}, format="json")
    assert native.json()["results"][0]["status"] == "rejected"
    assert not Memory.objects.filter(stack=alice, record_id="gone").exists()
    assert Memory.objects.filter(stack=alice, record_id="keep").exists()


def test_an_erased_stack_unarchived_still_refuses_its_old_records(cast: School) -> None:
    _native_push(cast.admin_api, "alice", ["r1"])
    assert cast.admin_api.post(cast.stack_url("erase"), {"requested_by": "x", "confirm": "alice"},
                               format="json").status_code == 200
    assert cast.admin_api.post(cast.stack_url("sync/push"), {"operations": []}, format="json").status_code == 409
    Stack.objects.filter(pk=cast.stack.pk).update(status="active")
    native = cast.admin_api.post(cast.stack_url("sync/push"), {"operations": [
        {"op": "upsert", "kind": "note", "record_id": "r1", "data": {"content": "again"}},
        {"op": "upsert", "kind": "note", "record_id": "new", "data": {"content": "new"}}]}, format="json")
    assert [r["status"] for r in native.json()["results"]] == ["rejected", "applied"]


def test_only_school_admins_erase(cast: School) -> None:
    _native_push(cast.admin_api, "alice", ["r1"])
    memory = Memory.objects.get(stack=cast.stack)
    body = {"requested_by": "x", "confirm": "alice"}
    assert cast.agent.post(cast.stack_url("erase"), body, format="json").status_code == 403
    by_teacher = csrf_session_client(cast.teacher).post(cast.stack_url("erase"), body, format="json")
    assert by_teacher.status_code == 403 and by_teacher.json()["error"]["code"] == "admin_required"
    assert cast.agent.post(cast.stack_url(f"memories/{memory.pk}/erase"), body,
                           format="json").status_code == 403
    other = school_cast("Other School", stack_slug="carol", other_stack_slug="dave")
    assert other.admin_api.post(cast.stack_url("erase"), body, format="json").status_code == 404
    # Bad input is a clear 400, never a partial erasure.
    wrong = cast.admin_api.post(cast.stack_url("erase"), {"requested_by": "x", "confirm": "bob"}, format="json")
    assert wrong.status_code == 400 and wrong.json()["error"]["code"] == "confirmation_mismatch"
    missing = cast.admin_api.post(cast.stack_url("erase"), {"confirm": "alice"}, format="json")
    assert missing.status_code == 400 and "requested_by" in missing.json()["error"]["fields"]
    assert Memory.objects.filter(stack=cast.stack).count() == 1
    # A certificate is its school admins' only.
    done = csrf_session_client(cast.admin).post(cast.stack_url("erase"), body, format="json").json()
    assert done["status"] == "done"
    assert csrf_session_client(cast.teacher).get(f"/api/v1/erasures/{done['id']}").status_code == 404
    assert other.admin_api.get(f"/api/v1/erasures/{done['id']}").status_code == 404


@pytest.mark.django_db(transaction=True)
def test_a_large_stack_is_erased_by_the_worker_with_progress(celery_worker: Any, monkeypatch: Any) -> None:
    cast = school_cast()
    _fill(cast, cast.stack, 1500, "a")
    _native_push(cast.admin_api, "bob", ["b1", "b2"])
    monkeypatch.setattr(erasure, "ASYNC_THRESHOLD", 1000)

    response = cast.admin_api.post(cast.stack_url("erase"), {"requested_by": "parent", "confirm": "alice"},
                                   format="json")

    assert response.status_code == 202, response.content
    assert response.json()["status"] in ("pending", "running") and response.json()["digest"] is None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        cert = cast.admin_api.get(f"/api/v1/erasures/{response.json()['id']}").json()
        if cert["status"] == "done":
            break
        time.sleep(0.2)
    assert cert["status"] == "done" and cert["counts"]["memory:note"] == 1500
    assert set(_stack_rows(cast.stack.pk).values()) == {0}
    assert Memory.objects.filter(stack=cast.other_stack).count() == 2
    assert type(cast.admin_api)().get(f"/api/v1/erasures/{cert['id']}/verify").json() == {"valid": True}
