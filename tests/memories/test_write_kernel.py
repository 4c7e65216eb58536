"""The memory-write kernel (memories.writes): the traces every write leaves, whichever form wrote it —
the single-row form (services) and the set-based form (sync) — and its extension points."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import transaction

from accounts.throttles import throttle_state_clear
from memories.models import Memory, MemoryRevision
from memories.records.normalize import NormalizedMemory, memory_payload_view, normalize_memory
from memories.records.schemas import canonical_text
from memories.services import memory_create, memory_forget, memory_update
from memories.tasks import embed_memories
from memories.writes import columns, hooks
from memoryhub.celery import app as celery_app
from stacks.models import Stack
from tests.factories import bearer_client, make_key, make_org, make_stack, sql_rows

pytestmark = pytest.mark.django_db

MB = 1024 * 1024


@pytest.fixture(autouse=True)
def fresh_throttles() -> Iterator[None]:
    throttle_state_clear()
    yield


@pytest.fixture
def changes() -> Iterator[list[hooks.MemoryChange]]:
    """Every MemoryChange the kernel announces while the test runs."""
    heard: list[hooks.MemoryChange] = []
    hooks.register_listener(heard.append)
    yield heard
    hooks.unregister_listener(heard.append)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The id lists of the embedding messages sent to the broker (none is really sent)."""
    messages: list[list[str]] = []

    def send_task(name: str, args: tuple[Any, ...], **options: Any) -> None:
        assert name == hooks.EMBED_TASK and options.get("ignore_result") is True
        messages.append(args[0])

    monkeypatch.setattr(celery_app, "send_task", send_task)
    return messages


def _agent(tier: str = "enterprise") -> tuple[Stack, Any]:
    org = make_org(tier=tier)
    stack = make_stack(org, "student")
    _, secret = make_key(org, stack=stack)
    return stack, bearer_client(secret)


def _note(record_id: str, content: str, **data: Any) -> dict[str, Any]:
    return {"op": "upsert", "kind": "note", "record_id": record_id, "updated_at": "2026-11-21T23:00:00+00:00",
            "data": {"content": content, **data}}


def _push(client: Any, stack: Stack, ops: list[dict[str, Any]]) -> Any:
    return client.post(f"/api/v1/stacks/{stack.slug}/sync/push", {"operations": ops}, format="json")


# --- column lists derive from the model -------------------------------------------------------------

def test_column_sets_follow_the_model() -> None:
    model_columns = {f.attname for f in Memory._meta.concrete_fields}
    assert "salience" not in model_columns  # dropped: the decay pass keeps salience in MemorySalience
    assert set(columns.COPY_COLUMNS) == model_columns - {"change_seq", "search_vector", "embedding"}
    assert None not in columns.COPY_TYPES  # every column COPY sends has a type psycopg can dump
    # The content columns are exactly what a payload sets (the client echo aside).
    normalized = normalize_memory("note", {"content": "x"})
    assert set(columns.CONTENT_COLUMNS) == set(normalized.as_model_fields()) - {"created_at", "client_updated_at"}
    # Pull renders the modelled columns of a client payload, which partial updates start from.
    view = memory_payload_view(Memory(kind="note", data={}, extra={}))
    assert set(columns.PAYLOAD_COLUMNS) == set(view)
    assert set(columns.SNAPSHOT_COLUMNS) >= set(columns.CONTENT_COLUMNS) | {"version", "forgotten_at", "deleted_at"}
    assert not set(columns.SNAPSHOT_COLUMNS) & {"embedding", "search_vector", "change_seq", "stability"}


def test_the_enqueuer_names_the_embedding_task() -> None:
    assert embed_memories.name == hooks.EMBED_TASK


# --- after commit: listeners and the one embedding enqueuer -----------------------------------------

def test_listeners_hear_each_committed_single_row_write_once(changes: list[hooks.MemoryChange],
                                                            sent: list[list[str]],
                                                            django_capture_on_commit_callbacks: Any) -> None:
    stack = make_stack(make_org())
    with django_capture_on_commit_callbacks(execute=True):
        memory = memory_create(stack=stack, kind="note", payload={"content": "first"}, source="api")
    hooks.embedding_message_taken(stack.pk)  # as the worker does when it starts the message's task
    with django_capture_on_commit_callbacks(execute=True):
        memory_update(memory=memory, payload={"content": "second"}, source="api")
    with django_capture_on_commit_callbacks(execute=True):
        memory_forget(memory=memory, reason="done", source="api")
    ids = (str(memory.pk),)
    assert changes == [hooks.MemoryChange(stack.pk, "create", ids, "api"),
                       hooks.MemoryChange(stack.pk, "update", ids, "api"),
                       hooks.MemoryChange(stack.pk, "forget", ids, "api")]
    assert sent == [[str(memory.pk)], [str(memory.pk)]]  # created, then its text changed; a forget embeds nothing


def test_nothing_is_announced_or_enqueued_for_a_write_that_rolls_back(
        changes: list[hooks.MemoryChange], sent: list[list[str]], django_capture_on_commit_callbacks: Any) -> None:
    stack = make_stack(make_org())
    with (django_capture_on_commit_callbacks(execute=True) as callbacks, pytest.raises(RuntimeError),
          transaction.atomic()):
        memory_create(stack=stack, kind="note", payload={"content": "never committed"}, source="api")
        raise RuntimeError("the caller's transaction fails after the write")
    assert callbacks == [] and changes == [] and sent == []
    assert not Memory.objects.exists()
    stack.refresh_from_db()
    assert (stack.memory_count, stack.bytes_used) == (0, 0)  # the counters rolled back with the row


def test_a_push_is_announced_once_per_action_and_embedded_in_messages_of_500(
        changes: list[hooks.MemoryChange], sent: list[list[str]], django_capture_on_commit_callbacks: Any) -> None:
    stack, client = _agent()
    with django_capture_on_commit_callbacks(execute=True):
        response = _push(client, stack, [_note(f"n{i}", f"note {i}") for i in range(600)])
    assert response.json()["applied"] == 600
    ids = {str(pk) for pk in Memory.objects.values_list("pk", flat=True)}
    assert [len(message) for message in sent] == [500, 100] and set(sent[0] + sent[1]) == ids
    assert len(changes) == 1 and changes[0].action == "create" and changes[0].source == "sync"
    assert set(changes[0].memory_ids) == ids

    changes.clear()
    sent.clear()
    later = "2026-11-22T00:00:00+00:00"
    with django_capture_on_commit_callbacks(execute=True):
        _push(client, stack, [{**_note("n0", "note 0, revised"), "updated_at": later},
                              {"op": "delete", "kind": "note", "record_id": "n1"},
                              _note("n2", "note 2")])  # an identical re-send: no change
    by_id = dict(Memory.objects.values_list("record_id", "pk"))
    assert sorted((c.action, c.memory_ids) for c in changes) == [("delete", (str(by_id["n1"]),)),
                                                                  ("update", (str(by_id["n0"]),))]
    assert sent == [[str(by_id["n0"])]]


def test_a_refused_push_announces_nothing(changes: list[hooks.MemoryChange], sent: list[list[str]],
                                          django_capture_on_commit_callbacks: Any) -> None:
    stack, client = _agent(tier="free")
    Stack.objects.filter(pk=stack.pk).update(bytes_used=10 * MB - 10)
    with django_capture_on_commit_callbacks(execute=True):
        assert _push(client, stack, [_note("n1", "does not fit")]).status_code == 402
    assert changes == [] and sent == [] and not Memory.objects.exists()


def test_a_broker_that_is_down_is_logged_and_the_write_stands(monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture,
                                                              django_capture_on_commit_callbacks: Any) -> None:
    tried: list[list[str]] = []

    def down(name: str, args: tuple[Any, ...], **kwargs: Any) -> None:
        tried.append(args[0])
        raise ConnectionError("broker unreachable")

    monkeypatch.setattr(celery_app, "send_task", down)
    stack = make_stack(make_org())
    with django_capture_on_commit_callbacks(execute=True):
        memory = memory_create(stack=stack, kind="note", payload={"content": "kept"}, source="api")
    assert Memory.objects.get(pk=memory.pk).embedded_version is None  # the sweep embeds it later
    assert "the sweep will pick it up" in caplog.text
    # No message waits for the stack, so its next small write tries to send one (it is not coalesced).
    with django_capture_on_commit_callbacks(execute=True):
        second = memory_create(stack=stack, kind="note", payload={"content": "also kept"}, source="api")
    assert tried == [[str(memory.pk)], [str(second.pk)]]


def test_in_eager_mode_the_embedding_runs_in_process(monkeypatch: pytest.MonkeyPatch,
                                                     django_capture_on_commit_callbacks: Any) -> None:
    """CELERY_TASK_ALWAYS_EAGER (a development setting) is honoured, as `.delay()` honoured it."""
    monkeypatch.setitem(celery_app.conf, "CELERY_TASK_ALWAYS_EAGER", True)  # the setting, as configured
    stack = make_stack(make_org())
    with django_capture_on_commit_callbacks(execute=True):
        memory = memory_create(stack=stack, kind="note", payload={"content": "embedded at once"}, source="api")
    assert Memory.objects.get(pk=memory.pk).embedded_version == memory.version


def test_a_failing_listener_does_not_undo_the_write(sent: list[list[str]], caplog: pytest.LogCaptureFixture,
                                                    django_capture_on_commit_callbacks: Any) -> None:
    def broken(change: hooks.MemoryChange) -> None:
        raise ValueError("listener bug")

    hooks.register_listener(broken)
    try:
        stack = make_stack(make_org())
        with django_capture_on_commit_callbacks(execute=True):
            memory_create(stack=stack, kind="note", payload={"content": "kept"}, source="api")
    finally:
        hooks.unregister_listener(broken)
    assert Memory.objects.count() == 1 and len(sent) == 1
    assert "listener" in caplog.text


# --- before storing: the transform hook (where redaction plugs in) -----------------------------------

def _redact(normalized: NormalizedMemory) -> NormalizedMemory:
    """A stand-in redactor: masks one word in a note's content, keeping the record self-consistent."""
    content = normalized.data.get("content") or ""
    if normalized.kind != "note" or "s3cret" not in content:
        return normalized  # idempotent: a redacted record passes unchanged
    data = {**normalized.data, "content": content.replace("s3cret", "[redacted]")}
    data_json = json.dumps(data, ensure_ascii=False)
    assert normalized.data_json is not None
    return dataclasses.replace(normalized, data=data, data_json=data_json,
                               text=canonical_text("note", data, normalized.extra),
                               size_bytes=normalized.size_bytes - len(normalized.data_json.encode())
                               + len(data_json.encode()))


@pytest.fixture
def redaction() -> Iterator[None]:
    hooks.register_transform(_redact)
    yield
    hooks.unregister_transform(_redact)


@pytest.mark.usefixtures("redaction")
def test_a_registered_transform_applies_to_both_forms_before_anything_is_stored() -> None:
    stack, client = _agent()
    single = memory_create(stack=stack, kind="note", payload={"content": "my s3cret plan"}, source="api")
    assert (single.text, single.data["content"]) == ("my [redacted] plan", "my [redacted] plan")
    memory_update(memory=single, payload={"content": "another s3cret"}, source="api")
    assert Memory.objects.get(pk=single.pk).data["content"] == "another [redacted]"
    assert MemoryRevision.objects.get(memory=single).snapshot["text"] == "my [redacted] plan"

    assert _push(client, stack, [_note("n1", "the s3cret is out", tags=["a"])]).json()["applied"] == 1
    # An update merges list fields: the stored, redacted record is normalised (and transformed) again.
    update = {**_note("n1", "still s3cret", tags=["b"]), "updated_at": "2026-11-22T00:00:00+00:00"}
    assert _push(client, stack, [update]).json()["applied"] == 1
    pushed = Memory.objects.get(record_id="n1")
    assert (pushed.text, pushed.data["content"], pushed.tags) == ("still [redacted]", "still [redacted]", ["b", "a"])
    assert not Memory.objects.filter(text__contains="s3cret").exists()
    assert sql_rows("SELECT sum(size_bytes) AS total FROM memories_memory")[0].total == \
        Stack.objects.get(pk=stack.pk).bytes_used


# --- storage is counted once ------------------------------------------------------------------------

# "Stored bytes" as the quota counts them: the record as the client sent it — its `data` and
# `extra` as JSON (what Postgres stores as jsonb renders to the same length for such records) plus its
# tags — not the canonical text, which is derived from `data`.
_STORED_BYTES_SQL = """
SELECT m.record_id, m.size_bytes,
       octet_length(m.data::text) + octet_length(m.extra::text)
       + COALESCE((SELECT sum(octet_length(t)) FROM unnest(m.tags) t), 0) AS sent_bytes
FROM memories_memory m WHERE m.stack_id = %s AND m.deleted_at IS NULL
"""


def test_counted_bytes_equal_the_stored_records_after_every_kind_of_write() -> None:
    stack, client = _agent()
    ops = [_note(f"n{i}", f"Fractions, café {i} " * (i + 1), tags=["math", "élève"], mood="calm") for i in range(5)]
    ops.append({"op": "upsert", "kind": "episode", "record_id": "e1", "updated_at": "2026-11-21T23:00:00+00:00",
                "data": {"objective": "Practise", "outcome": "Solved 8 of 10", "lessons": ["Draw the pie"]}})
    assert _push(client, stack, ops).json()["applied"] == 6
    later = "2026-11-22T00:00:00+00:00"
    _push(client, stack, [{**_note("n1", "shorter"), "updated_at": later},
                          {"op": "delete", "kind": "note", "record_id": "n2"}])
    created = memory_create(stack=stack, kind="belief", payload={"statement": "Pizza diagrams work"}, source="api")
    memory_update(memory=created, payload={"statement": "Pizza diagrams work for most students"}, source="api")
    memory_forget(memory=Memory.objects.get(record_id="n3"), reason="test", source="api")

    rows = sql_rows(_STORED_BYTES_SQL, [stack.pk])
    assert len(rows) == 6  # five notes, an episode and a belief; n2 deleted
    assert all(row.size_bytes == row.sent_bytes for row in rows), rows
    stack.refresh_from_db()
    assert stack.memory_count == len(rows)
    assert stack.bytes_used == sum(row.size_bytes for row in rows)


def _big_notes(count: int, size: int) -> list[dict[str, Any]]:
    return [_note(f"big-{i}", f"{i:05d} " + "Fractions and decimals practice. " * (size // 33)) for i in range(count)]


def _sent_bytes(ops: list[dict[str, Any]]) -> int:
    return sum(len(json.dumps(op["data"], ensure_ascii=False).encode()) for op in ops)


def test_a_push_of_n_mb_fits_a_limit_slightly_above_n_mb() -> None:
    """A 5.7 MB batch fits a free-tier stack just under its 10 MB: its text is counted once, not twice."""
    stack, client = _agent(tier="free")
    ops = _big_notes(600, 10_000)
    sent = _sent_bytes(ops)
    assert 5.5 * MB < sent < 6 * MB
    Stack.objects.filter(pk=stack.pk).update(bytes_used=10 * MB - int(sent * 1.02))  # 2 % of headroom
    response = _push(client, stack, ops)
    assert response.status_code == 200, response.content[:300]
    assert response.json()["applied"] == 600
    stack.refresh_from_db()
    assert 10 * MB - int(sent * 1.02) + sent <= stack.bytes_used <= 10 * MB


def test_a_push_over_the_limit_is_still_refused() -> None:
    stack, client = _agent(tier="free")
    ops = _big_notes(100, 10_000)
    Stack.objects.filter(pk=stack.pk).update(bytes_used=10 * MB - _sent_bytes(ops) // 2)
    assert _push(client, stack, ops).status_code == 402
    assert not Memory.objects.exists()


# In a process of its own: the module is imported afresh each round (importlib.reload), as each web
# process first imports it, and its first new rows are made on 8 threads at once on a busy
# interpreter (tests/threads.py). Prints how many rounds gave two rows one object.
_ROWS_OF_A_FRESH_PROCESS = """
import importlib, json
import django
django.setup()
from django.utils import timezone
from memories.writes import sets
from tests.threads import at_once, busy_interpreter
rounds_sharing = 0
with busy_interpreter():
    for _ in range(300):
        importlib.reload(sets)
        rows = at_once(8, lambda: sets.blank_row(stack_id=1, kind="note", record_id="r", now=timezone.now()))
        objects = [value for row in rows for value in vars(row).values() if isinstance(value, (list, dict))]
        assert len(rows) == 8 and objects
        rounds_sharing += len({id(value) for value in objects}) < len(objects)
print(json.dumps(rounds_sharing))
"""

@pytest.mark.slow  # starts an interpreter
def test_rows_made_on_threads_at_once_never_share_a_list_or_an_object() -> None:
    """A web process's first pushes make their new rows on several threads at once, from the
    model's defaults made on first use: no two rows may hold the same tags, data or grants object,
    or a write that changed one in place would change another student's memory too."""
    result = subprocess.run([sys.executable, "-c", _ROWS_OF_A_FRESH_PROCESS], cwd=settings.BASE_DIR,
                            env=dict(os.environ, DJANGO_SETTINGS_MODULE="memoryhub.settings"),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == 0
