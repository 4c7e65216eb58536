"""The sync engine: apply a batch of parsed operations to one stack, in order, each on its own.

How a push is applied (`apply_batch`), and why:

1. The caller (memories.sync.push) holds the stack row lock for the whole push and read the change
   time from the database after taking it, so pushes to one stack are serialised, a pull's watermark
   is exact and `change_seq` commits in order within the stack.
2. Every operation was parsed and validated before (memories.sync.protocol, through the write
   kernel's `prepare_memory`); a bad one is already that operation's conflict.
3. The batch's stored rows are read with one query (memories.sync.lookup); operations are then
   applied in order to an in-memory state, so two operations on one record in a batch behave as if
   applied one after the other: last writer by `data.local_updated_at` wins, list fields are
   unioned (capped), tombstones and memories the server forgot are never resurrected by a client,
   an identical re-send changes nothing. The storage quota is checked per operation.
4. The final states are written by the write kernel's set-based form (memories.writes.sets: one
   COPY for new rows, one UPDATE, one revision INSERT, one counter UPDATE, embedding and change
   listeners after commit). Only if the database refuses that (a rejection we could not foresee) is
   the whole push rolled back and applied again with each record in its own savepoint, so one
   failing record never rolls back the others (`with_retry_per_record`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from django.db import DatabaseError, transaction

from accounts.authors import Author
from billing import entitlements
from memories.models import Memory
from memories.privacy.redaction.policy import RedactionPolicy, stack_policy
from memories.privacy.tombstones import erased_keys
from memories.records.normalize import NormalizedMemory, memory_payload_view
from memories.sync.lookup import _lookup_existing
from memories.sync.protocol import (
    ARRAY_CAP,
    ARRAY_FIELDS,
    CLIENT_FORGET_REASON,
    REQUIRED_FOR_PULL,
    OpRejected,
    OpResult,
    SyncOp,
    normalize_payload,
    parse_native_op,
)
from memories.writes.columns import SYNC_MUTABLE_COLUMNS
from memories.writes.gate import write_refusal
from memories.writes.hooks import prepare_author
from memories.writes.rows import memory_snapshot
from memories.writes.sets import RecordWrite, blank_row, finish_set, write_set
from stacks.models import Stack

logger = logging.getLogger(__name__)

SYNC_SOURCE = "sync"


@dataclass(eq=False)
class _State(RecordWrite):
    """A record while a batch is applied: the kernel's `RecordWrite` plus the engine's bookkeeping."""

    populated: bool = False  # a new row has received its first accepted upsert
    op_indexes: list[int] = field(default_factory=list)


# --- one operation on one record's state ----------------------------------------------------------------

def _union(first: Any, second: Any) -> list[Any]:
    """Set union keeping first-seen order; dicts compared by value. Capped at ARRAY_CAP items."""
    result: list[Any] = []
    seen: set[str] = set()
    for source in (first, second):
        if source is None:
            continue
        items = [source] if isinstance(source, str) else source if isinstance(source, list) else []
        for item in items:
            marker = repr(sorted(item.items())) if isinstance(item, dict) else repr(item)
            if marker not in seen:
                seen.add(marker)
                result.append(item)
                if len(result) >= ARRAY_CAP:
                    return result
    return result


def _merge_lists(target: dict[str, Any], first: dict[str, Any], second: dict[str, Any],
                 names: tuple[str, ...]) -> None:
    """target[name] = union(first[name], second[name]) for each list field either side carries."""
    for name in names:
        if first.get(name) is not None or second.get(name) is not None:
            target[name] = _union(first.get(name), second.get(name))


def _assign(row: Memory, normalized: NormalizedMemory) -> tuple[bool, bool]:
    """Copy normalised values onto `row`. Returns (anything changed, text changed)."""
    values = normalized.as_model_fields()
    values.pop("created_at", None)  # the server keeps the first creation time
    values.pop("client_updated_at", None)  # set by the caller (with fallbacks)
    changed = False
    text_changed = row.text != values.get("text", row.text)
    for name, value in values.items():
        if getattr(row, name) != value:
            setattr(row, name, value)
            changed = True
    return changed, text_changed


def _wire_view(row: Memory) -> dict[str, Any]:
    return memory_payload_view(row)


def _apply_upsert(state: _State, op: SyncOp, now: datetime, redaction: RedactionPolicy) -> None:
    row = state.row
    assert op.normalized is not None
    known = not state.is_new or state.populated  # stored, or created earlier in this batch
    if known and row.deleted_at is not None:
        return  # a tombstone is never resurrected by a client write; acknowledged as is
    if known and row.forgotten_at is not None and row.forgotten_reason != CLIENT_FORGET_REASON:
        # Forgotten by the server (decay, an admin): a device that still holds the memory must not
        # bring it back. Restoring is a deliberate act on the lifecycle API, not a side effect.
        return
    if state.is_new and not state.populated:
        state.populated = True
        values = op.normalized.as_model_fields()
        values.update(client_updated_at=op.client_updated_at, client_version=op.client_version,
                      created_at=op.created_at or now)
        row.__dict__.update(values)  # a NewRow: plain attributes, nothing to compare against
        state.changed = state.text_changed = True
        state.normalized = op.normalized
    else:
        stored_time = row.client_updated_at
        incoming_time = op.client_updated_at
        stale = stored_time is not None and incoming_time is not None and incoming_time < stored_time
        fields = ARRAY_FIELDS.get(row.kind, ())
        if stale:
            # The stored copy is newer: keep it, take only the incoming list items (set union).
            merged = _wire_view(row)
            _merge_lists(merged, merged, op.payload, fields)
            normalized = normalize_payload(row.kind, merged, redaction) if fields else None
            if normalized is not None:
                changed, text_changed = _assign(row, normalized)
                state.changed |= changed
                state.text_changed |= text_changed
            # The stale device gets the newer copy on its next pull (docs/kernle-protocol.md §3.8).
            state.touched = True
            return
        payload = op.payload
        if fields:
            stored = _wire_view(row)
            payload = dict(payload)
            _merge_lists(payload, payload, stored, fields)
            normalized = normalize_payload(row.kind, payload, redaction)
        else:
            normalized = op.normalized
        changed, text_changed = _assign(row, normalized)
        if text_changed:
            state.normalized = normalized  # its original text, for the write kernel (memories.privacy.originals)
        if row.client_updated_at != op.client_updated_at or row.client_version != op.client_version:
            row.client_updated_at = op.client_updated_at
            row.client_version = op.client_version
            changed = True
        state.changed |= changed
        state.text_changed |= text_changed
    # Forgetting is the client's to set and (for its own forgets) to undo (§3.7).
    if op.wants_forget and row.forgotten_at is None:
        row.forgotten_at, row.forgotten_reason = now, CLIENT_FORGET_REASON
        state.changed, state.action = True, "forget"
    elif not op.wants_forget and row.forgotten_at is not None and row.forgotten_reason == CLIENT_FORGET_REASON:
        row.forgotten_at, row.forgotten_reason = None, ""
        state.changed, state.action = True, "recover"
    if op.wants_delete and row.deleted_at is None:
        row.deleted_at = now
        state.changed, state.action = True, "delete"


def _apply_delete(state: _State, now: datetime) -> None:
    if state.row.deleted_at is None:
        state.row.deleted_at = now
        state.changed, state.action = True, "delete"


# --- a batch ---------------------------------------------------------------------------------------------

def apply_native_operations(*, stack: Stack, operations: list[Any], now: datetime, per_record: bool,
                            author: Author, writer: str = SYNC_SOURCE) -> list[OpResult]:
    """Parse native-format operations and apply them to `stack` (caller holds its lock, inside a
    transaction) as `author`: one result per operation, parse rejections included. The native push
    and the archive import (`writer` "import", which the consent and pause gate lets through) both
    write this way."""
    results = [OpResult(index=i, ok=False) for i in range(len(operations))]
    parsed: list[SyncOp] = []
    redaction = stack_policy(stack)  # the school's choice, once for the batch
    for index, raw in enumerate(operations):
        try:
            parsed.append(parse_native_op(index, raw, now, redaction))
        except OpRejected as rejected:
            results[index] = OpResult(index=index, ok=False, error=rejected.message, code=rejected.code,
                                      fields=rejected.fields)
    apply_batch(stack=stack, ops=parsed, results=results, now=now, storage_limited=True, strict_quota=True,
                per_record=per_record, author=author, writer=writer)
    return results


def apply_batch(*, stack: Stack, ops: list[SyncOp], results: list[OpResult], now: datetime,
                storage_limited: bool, strict_quota: bool, per_record: bool, author: Author,
                writer: str = SYNC_SOURCE) -> None:
    """Apply parsed operations (caller holds the stack lock, inside a transaction) as `author`: the
    written_by of the records it creates and the author of every revision it keeps (its agent label
    redacted under the stack's policy first; docs/privacy.md "Provenance").

    `results` is indexed by op.index and already holds the parse-time rejections; each applied
    operation's result gets its record's new version. With `strict_quota` (native API) a batch that
    would exceed the storage quota raises QuotaExceeded; otherwise each growing operation past the
    quota becomes that operation's conflict (kernle, §3.10). Embedding of changed text and the
    change listeners follow the commit (the write kernel's `finish_set`).
    """
    # Consent and pause (docs/consent.md): the kernel's gate, read from the locked stack row; every
    # operation is that refusal and nothing is stored.
    refusal = write_refusal(stack, source=writer)
    if refusal is not None:
        for op in ops:
            results[op.index] = OpResult(index=op.index, ok=False, code=refusal.code, error=refusal.conflict)
        return
    keys = {(op.kind, op.record_id) for op in ops}
    redaction = stack_policy(stack)  # for records re-normalised when list fields merge
    author = prepare_author(author, redaction=redaction)
    states: dict[tuple[str, str], _State] = {}
    if keys:
        for row in _lookup_existing(stack, keys):
            live = row.deleted_at is None
            states[(row.kind, row.record_id)] = _State(
                row=row, is_new=False, original_size=row.size_bytes if live else 0, original_live=live,
                snapshot=None, snapshot_version=row.version)

    # Erased records stay erased: an old device re-pushing their ids is refused (memories.privacy.tombstones).
    # A stack never erased from has no tombstones: its flag, read with the locked row, spares the query.
    erased = erased_keys(stack, keys - states.keys()) if keys and stack.has_erasures else set()
    remaining = entitlements.storage_remaining(organization=stack.organization) if storage_limited else None
    added_bytes = 0
    for op in ops:
        key = (op.kind, op.record_id)
        if key in erased:  # a delete of it is simply true already
            results[op.index] = OpResult(index=op.index, ok=True) if op.delete else OpResult(
                index=op.index, ok=False, code="erased",
                error="this record was erased or expired on the server and is not stored again")
            continue
        state = states.get(key)
        if op.delete and state is None:
            results[op.index] = OpResult(index=op.index, ok=True)  # never seen: acknowledged (§3.6)
            continue
        if state is None:
            state = _State(row=blank_row(stack_id=stack.pk, kind=op.kind, record_id=op.record_id, now=now),
                           is_new=True, original_size=0, original_live=False, snapshot=None, snapshot_version=0)
        if state.snapshot is None and not state.is_new:
            state.snapshot = memory_snapshot(state.row)
        before = _size_of(state)
        # A record not yet in the batch's state is simply dropped if this operation is rejected;
        # only a known one needs its before-image to undo a rejected operation.
        before_image = _image(state) if key in states else {}
        try:
            if op.delete:
                _apply_delete(state, now)
            else:
                _apply_upsert(state, op, now, redaction)
        except OpRejected as rejected:
            _restore(state, before_image)
            results[op.index] = OpResult(index=op.index, ok=False, error=rejected.message, code=rejected.code,
                                         fields=rejected.fields)
            continue
        growth = _size_of(state) - before
        if remaining is not None and growth > 0 and added_bytes + growth > remaining:
            _restore(state, before_image)
            if strict_quota:
                raise entitlements.storage_quota_error(stack.organization)
            results[op.index] = OpResult(index=op.index, ok=False, code="storage_quota_exceeded",
                                         error=entitlements.storage_quota_message(stack.organization))
            continue
        added_bytes += growth
        states[key] = state
        state.op_indexes.append(op.index)
        results[op.index] = OpResult(index=op.index, ok=True)

    written = _write_states(stack, [s for s in states.values() if s.op_indexes], now, results, per_record, author)
    _log_unappliable(stack, written)
    for state in written:
        for index in state.op_indexes:
            if results[index].ok:
                results[index].version = state.row.version


def _log_unappliable(stack: Stack, written: list[_State]) -> None:
    """Say so when a record was stored that no kernle 0.15.0 device could apply (§3.9)."""
    for state in written:
        key = REQUIRED_FOR_PULL.get(state.row.kind)
        if key is None or not state.changed or state.row.deleted_at is not None:
            continue
        value = state.row.data.get(key)
        if not (isinstance(value, str) and value.strip(" ")):  # as `_APPLIABLE_SQL` (btrim) judges it
            logger.warning("sync stored %s %r in stack %s without `%s`: kept, but left out of kernle pulls "
                           "(a kernle 0.15.0 device cannot apply it)", state.row.kind, state.row.record_id,
                           stack.pk, key)


def _size_of(state: _State) -> int:
    return 0 if state.row.deleted_at is not None else state.row.size_bytes


_FLAGS = ("changed", "touched", "text_changed", "action", "populated", "normalized")


def _image(state: _State) -> dict[str, Any]:
    """Everything an operation may change, so a rejected operation leaves no trace in the batch."""
    image = {name: getattr(state.row, name) for name in SYNC_MUTABLE_COLUMNS if name in state.row.__dict__}
    image.update({f"state.{name}": getattr(state, name) for name in _FLAGS})
    return image


def _restore(state: _State, image: dict[str, Any]) -> None:
    for name, value in image.items():
        if name.startswith("state."):
            setattr(state, name[6:], value)
        else:
            setattr(state.row, name, value)


_Result = TypeVar("_Result")


class _BatchRefused(Exception):
    """The database refused the set-based write of a batch: the push is rolled back and applied
    again record by record (`with_retry_per_record`)."""


def with_retry_per_record(apply: Callable[[bool], _Result]) -> _Result:
    """Run `apply(per_record)` in its own transaction: first set-based with no savepoint, and only
    if the database refuses that write (a rejection we could not foresee), once more from the start
    with each record in its own savepoint, so one failing record never rolls back the others.
    WHY not a savepoint around the set-based write: it costs two round trips on every push, for a
    case that almost never happens."""
    try:
        with transaction.atomic():
            return apply(False)
    except _BatchRefused:
        logger.warning("a sync batch was refused by the database; applying it again record by record")
    with transaction.atomic():
        return apply(True)


def _write_states(stack: Stack, states: list[_State], now: datetime, results: list[OpResult],
                  per_record: bool, author: Author) -> list[_State]:
    """Persist the batch through the write kernel's set-based form: in one go, or (`per_record`) one
    savepoint per record; then the counters and after-commit effects, once for what was written."""
    pending = [s for s in states if s.changed or s.touched]
    if not per_record:
        try:
            write_set(pending, source=SYNC_SOURCE, now=now, author=author)
        except (DatabaseError, psycopg.Error) as exc:
            raise _BatchRefused(stack.pk) from exc
        written = pending
    else:
        written = []
        for state in pending:
            try:
                with transaction.atomic():
                    write_set([state], source=SYNC_SOURCE, now=now, author=author)
                written.append(state)
            except (DatabaseError, psycopg.Error) as exc:
                logger.warning("sync record refused by the database: %s", type(exc).__name__)
                for index in state.op_indexes:
                    results[index] = OpResult(index=index, ok=False, code="not_stored",
                                              error="the record could not be stored; check its fields")
                state.op_indexes = []
    finish_set(stack_id=stack.pk, records=written, source=SYNC_SOURCE, sync_at=now)
    unchanged = [s for s in states if not (s.changed or s.touched)]
    return written + unchanged

