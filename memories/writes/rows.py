"""The write kernel's single-row form: one memory (or one all-or-nothing batch of new ones) at a time.

`memories.services` is built on it: the services validate, check quotas and decide what changes;
these functions write it the one way every memory is written (see the package docstring). All of
them expect to run inside a transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from django.db import DEFAULT_DB_ALIAS, transaction
from django.db.models import F
from django.utils import timezone

from accounts.authors import Author
from memories.models import Memory, MemoryKind, MemoryRevision, NextChangeSeq, StackDailyActivity
from memories.privacy.originals import keep_originals
from memories.records.normalize import NormalizedMemory
from memories.writes.columns import COPY_COLUMNS, SNAPSHOT_COLUMNS, new_row_values
from memories.writes.gate import ensure_accepting_writes
from memories.writes.hooks import SMALL_EMBED_MESSAGE_IDS, after_commit
from memories.writes.outbox import Statement
from stacks.models import Stack

_STACK_TABLE = Stack._meta.db_table
# A new raw memory's text as submitted when redaction changed it (`NormalizedMemory.original_text`):
# set on the unsaved Memory by `new_memory`, sealed by `insert_memories` (memories.privacy.originals).
_ORIGINAL_TEXT = "_original_text"
_COUNTERS_SQL = (f"UPDATE {_STACK_TABLE} SET memory_count = memory_count + %(c_count)s, "  # noqa: S608 - constants only
                 "bytes_used = bytes_used + %(c_bytes)s WHERE id = %(c_stack)s")
_SYNC_COUNTERS_SQL = (f"UPDATE {_STACK_TABLE} SET memory_count = memory_count + %(c_count)s, "  # noqa: S608 - constants
                      "bytes_used = bytes_used + %(c_bytes)s, last_sync_at = %(c_sync)s WHERE id = %(c_stack)s")
# A write that created or changed memories also records when (Stack.last_write_at) and adds them to
# the stack's row of the day in the rollup (StackDailyActivity): in the same statement as the
# counters, so a write (or a whole push) still costs one round trip for its bookkeeping. The rollup
# row is the stack's own, and every writer holds the stack's lock here: nobody waits on it.
# (Named parameters, prefixed `c_`: the statement travels with the change event's in one round trip,
# memories.writes.outbox.record_change.)
_ACTIVITY_TABLE = StackDailyActivity._meta.db_table
_WRITTEN_COUNTERS_SQL = (
    f"WITH stack AS (UPDATE {_STACK_TABLE} SET memory_count = memory_count + %(c_count)s, "  # noqa: S608 - constants
    "bytes_used = bytes_used + %(c_bytes)s, last_sync_at = COALESCE(%(c_sync)s, last_sync_at), "
    "last_write_at = %(c_now)s WHERE id = %(c_stack)s RETURNING id) "
    f"INSERT INTO {_ACTIVITY_TABLE} (stack_id, day, written) SELECT id, %(c_day)s, %(c_written)s FROM stack "
    f"ON CONFLICT (stack_id, day) DO UPDATE SET written = {_ACTIVITY_TABLE}.written + EXCLUDED.written"
)


def lock_stack_changes(*stack_ids: int) -> None:
    """Take the stack row locks (FOR NO KEY UPDATE) until commit, before drawing a change_seq.

    Sequence numbers are drawn when a row is written but become visible at commit; without this,
    a writer that drew 100 could commit after one that drew 101, and a reader paging by cursor
    past 101 would never see 100. Sync pushes hold the same row (FOR UPDATE) for the whole push.
    Lock order everywhere: the stack row first, then memory rows; several stacks in pk order, in
    one statement. Caller is in a transaction.
    """
    list(Stack.objects.select_for_update(no_key=True).filter(pk__in=stack_ids).order_by("pk")
         .values_list("pk", flat=True))


def locked_memory(memory: Memory) -> Memory:
    """Re-read the row under a lock so concurrent changes serialise (caller is in a transaction).
    The stack's change lock comes first (see `lock_stack_changes` for the order)."""
    lock_stack_changes(memory.stack_id)
    return Memory.objects.select_for_update().get(pk=memory.pk)


def memory_snapshot(memory: Any) -> dict[str, Any]:
    """The stored state of a memory as JSON: the before-image a revision keeps."""
    snapshot: dict[str, Any] = {}
    for name in SNAPSHOT_COLUMNS:
        value = getattr(memory, name)
        snapshot[name] = value.isoformat() if isinstance(value, datetime) else value
    return snapshot


def counters_statement(*, stack_id: int, count_delta: int, bytes_delta: int, sync_at: datetime | None = None,
                       written: int = 0) -> Statement | None:
    """The relative UPDATE that moves the stack's usage counters, to run in the caller's transaction
    (None: nothing to move). The writers hand it to `hooks.after_commit`, which sends it in the same
    round trip as the write's change event.

    The caller holds the stack's lock (`lock_stack_changes`, or a push's FOR UPDATE), so this
    waits for nobody, and the counters commit (or roll back) with the rows they count.
    `sync_at` also records the stack's last sync (the set-based form, for pushes). `written`: how
    many memories this write created or changed the content of — then the same statement stamps
    `Stack.last_write_at` and adds them to today's (UTC) `StackDailyActivity` row.
    """
    params: dict[str, Any] = {"c_count": count_delta, "c_bytes": bytes_delta, "c_sync": sync_at, "c_stack": stack_id}
    if written:
        now = sync_at or timezone.now()
        return Statement(_WRITTEN_COUNTERS_SQL, {**params, "c_now": now, "c_day": now.astimezone(UTC).date(),
                                                 "c_written": written})
    if sync_at is not None:
        return Statement(_SYNC_COUNTERS_SQL, params)
    if count_delta or bytes_delta:
        return Statement(_COUNTERS_SQL, params)
    return None


def stack_usage_adjust(*, stack_id: int, count_delta: int, bytes_delta: int) -> None:
    """Move the stack's usage counters once the surrounding transaction commits.

    Only for writers that cannot take the stack lock before their memory rows — the TTL purge picks
    its rows with SKIP LOCKED, and locking the stack afterwards would invert the lock order. Every
    other writer moves them with `counters_statement` under the stack lock it holds.
    """
    if not count_delta and not bytes_delta:
        return

    def apply() -> None:
        Stack.objects.filter(pk=stack_id).update(
            memory_count=F("memory_count") + count_delta, bytes_used=F("bytes_used") + bytes_delta
        )

    transaction.on_commit(apply)


def new_memory(*, stack: Stack, normalized: NormalizedMemory, record_id: str | None, now: datetime,
               author: Author) -> Memory:
    """An unsaved memory holding `normalized` (its record id: `record_id`, or its own id), written by
    `author` (`hooks.prepare_author`'s result; stored as `written_by`, docs/privacy.md "Provenance")."""
    memory_id = uuid.uuid4()
    fields = normalized.as_model_fields()
    fields.setdefault("created_at", now)
    memory = Memory(
        id=memory_id, stack=stack, kind=normalized.kind, record_id=record_id or str(memory_id),
        server_updated_at=now, embedded_version=None, written_by=author.as_json(), **fields,
    )
    if normalized.original_text is not None:
        setattr(memory, _ORIGINAL_TEXT, normalized.original_text)
    return memory


# New memories' INSERT, written out: compiling the ORM's (Model.save, bulk_create) cost more of a
# single write's CPU than anything else it does (docs/benchmarks.md "Figures behind code choices").
# The columns are COPY's (every column the database does not fill), rendered as COPY renders them.
# Named parameters (`m<row>_<column>`): the INSERT travels with the counters and the change event in
# one round trip (outbox.Statement).
_INSERT_SQL = f"INSERT INTO {Memory._meta.db_table} ({', '.join(COPY_COLUMNS)}) VALUES "  # noqa: S608 - the model's names


@lru_cache(maxsize=16)
def _insert_sql(rows: int) -> str:
    values = ", ".join("(" + ", ".join(f"%(m{row}_{column})s" for column in range(len(COPY_COLUMNS))) + ")"
                       for row in range(rows))
    return f"{_INSERT_SQL}{values} RETURNING change_seq"


def _insert_statement(memories: Sequence[Memory]) -> Statement:
    """The INSERT of unsaved memories, whose rows leave them as the ORM leaves saved ones: their
    `change_seq` read back, and known to be stored in the default database."""

    def read(change_seqs: list[tuple[Any, ...]]) -> None:
        # In the VALUES' order, as Django's bulk_create relies on too.
        for memory, (change_seq,) in zip(memories, change_seqs, strict=True):
            memory.change_seq = change_seq
            memory._state.adding = False
            memory._state.db = DEFAULT_DB_ALIAS

    params = {f"m{row}_{column}": value for row, memory in enumerate(memories)
              for column, value in enumerate(new_row_values(memory.__dict__))}
    return Statement(_insert_sql(len(memories)), params, read)


def insert_memories(*, stack: Stack, memories: Sequence[Memory], source: str, stack_locked: bool = False) -> None:
    """Store new memories (built with `new_memory`), all or nothing.

    Takes the stack's change lock (unless the caller already holds a lock on the stack row:
    `stack_locked`, e.g. from `stack_for_principal(lock=True)`), stamps `server_updated_at` under it,
    inserts, counts them and, after commit, queues their embedding and tells the listeners ("create").
    An `IntegrityError` (e.g. a record id already used for its kind) is raised as is and leaves the
    caller's transaction unusable: the caller must let it (or what it turns it into) leave its own
    `transaction.atomic` block, which rolls back to that block's start. The services do (a 409); a
    savepoint here would cost two round trips on every write to protect nothing.
    A stack that takes no content now (`gate.write_refusal`: consent, pause) is a 403 before anything
    is written.
    """
    if not memories:
        return
    # Consent and pause (docs/consent.md): refused before anything is stored.
    ensure_accepting_writes(stack, source=source)
    if not stack_locked:
        lock_stack_changes(stack.pk)
    now = timezone.now()
    for memory in memories:
        memory.server_updated_at = now
    counters = counters_statement(stack_id=stack.pk, count_delta=len(memories),
                                  bytes_delta=sum(m.size_bytes for m in memories), written=len(memories))
    ids = [m.pk for m in memories]
    # The INSERT, the counters and the change event: one round trip.
    after_commit(stack_id=stack.pk, source=source, changes=[("create", ids)], embed_ids=ids,
                 embed_message_ids=SMALL_EMBED_MESSAGE_IDS, along=(_insert_statement(memories), counters))
    originals = {m.pk: getattr(m, _ORIGINAL_TEXT) for m in memories if hasattr(m, _ORIGINAL_TEXT)}
    if originals:
        keep_originals(stack_id=stack.pk, originals=originals)


def save_change(memory: Memory, *, before: dict[str, Any], source: str, author: Author, action: str,
                fields: Sequence[str], reason: str = "", text_changed: bool = False, count_delta: int = 0,
                bytes_delta: int = 0, original_text: str | None = None) -> Memory:
    """Write a change already made to `memory` in memory (attributes set by the caller).

    `memory` was read with `locked_memory` (stack lock, then row lock); `before` is its
    `memory_snapshot` from before the caller changed it; `fields` are the attributes changed.
    Keeps the revision (its `author`: who made this change, `hooks.prepare_author`'s result), bumps
    `version`, stamps `change_seq` and `server_updated_at` (and `embedded_version = NULL` when
    `text_changed`), moves the counters by the deltas and, after
    commit, queues embedding (text changed) and tells the listeners (`action`).
    A raw memory whose text changed gets its kept original replaced: by `original_text` (its text as
    submitted, when redaction changed it; sealed if the school opted in) or by none.
    Returns the memory with its new `version` and `change_seq`.
    """
    if memory.kind == MemoryKind.RAW and (text_changed or action == "delete"):
        keep_originals(stack_id=memory.stack_id,
                       originals={memory.pk: original_text} if original_text is not None and action != "delete" else {},
                       stale=[memory.pk])
    MemoryRevision.objects.create(memory=memory, version=before["version"], source=source, action=action,
                                  reason=reason, snapshot=before, author=author.as_json())
    memory.version = F("version") + 1
    memory.change_seq = NextChangeSeq()
    memory.server_updated_at = timezone.now()
    update_fields = ["version", "change_seq", "server_updated_at", *fields]
    if text_changed:
        memory.embedded_version = None
        update_fields.append("embedded_version")
    memory.save(update_fields=update_fields)
    memory.refresh_from_db(fields=["version", "change_seq"])
    # Only a content change is a write of the memory; forget/recover/protect decide about it.
    counters = counters_statement(stack_id=memory.stack_id, count_delta=count_delta, bytes_delta=bytes_delta,
                                  written=int(action == "update"))
    after_commit(stack_id=memory.stack_id, source=source, changes=[(action, [memory.pk])],
                 embed_ids=[memory.pk] if text_changed else (), along=(counters,))
    return memory


def note_revision(memory: Memory, *, source: str, author: Author, action: str, snapshot: dict[str, Any],
                  reason: str = "") -> None:
    """Write a decision about `memory` down without changing it (a feedback review, a smart-ingest
    reinforce / link / supersede note): a revision at its current version — no version bump, no
    change_seq, so clients do not pull anything — and, after commit, `MemoryChange(action)` to the
    listeners. The caller holds the row through `locked_memory` when it also writes decay state."""
    MemoryRevision.objects.create(memory=memory, version=memory.version, source=source, action=action,
                                  reason=reason, snapshot=snapshot, author=author.as_json())
    after_commit(stack_id=memory.stack_id, source=source, changes=[(action, [memory.pk])])
