"""Sync: agents push and pull their stacks (kernle-protocol.md §5-§7, §12.1, §12.6).

Two wire formats share one engine:

* the **Kernle protocol** (`POST /sync/push`, `POST /sync/pull`) spoken by the real `kernle` CLI:
  per-operation conflicts, an explicit acknowledgement list, a complete change set since the
  client's clock (made safe by a per-credential watermark);
* the **native** API (`/api/v1/stacks/{stack}/sync/…`): batches of up to 1,000 operations with
  per-operation results, and pull by an opaque cursor over the global `change_seq`.

How a push is applied (`_apply_batch`), and why:

1. The stack row is locked for the whole push and the change time is read from the database
   *after* the lock, so pushes to one stack are serialised and a pull's watermark is exact (§6.4
   step 10, §7.6). The same lock orders `change_seq` commits within a stack, which is what makes a
   cursor safe to resume from.
2. Every operation is parsed and validated in Python first (through `memories.schemas`, the one
   schema every write goes through); a bad one becomes that operation's conflict and nothing else.
3. The batch's rows are read with one query (one index probe per key, see `_lookup_existing`);
   operations are then applied in order to an in-memory state (so two operations on one record
   in a batch behave as if applied one after the other):
   last writer by `data.local_updated_at` wins, list fields are unioned (capped), tombstones and
   forgotten memories are never resurrected by a client, an identical re-send changes nothing.
4. The final states are written set-based (one COPY for new rows, one UPDATE, one revision
   INSERT). Only if the database refuses that (a rejection we could not foresee) is the whole push
   rolled back and applied again with each record in its own savepoint, so one failing record
   never rolls back the others (`_with_retry_per_record`).
5. Everything is acknowledged only after the transaction commits (the view answers after the
   service returns); embedding jobs are enqueued after commit.

Pulls render JSON without decoding records (see `_record_json`): a complete kernle change set of
10,000 records is one query and string joins.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import operator
import re
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from django.core.cache import cache
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from accounts.models import Organization
from accounts.principal import Principal
from billing import entitlements
from memories.models import Memory, MemoryKind, MemoryRevision, NextChangeSeq, SyncWatermark
from memories.schemas import (
    KIND_FOR_TABLE,
    LIST_ITEMS,
    NormalizedMemory,
    memory_payload_view,
    normalize_memory,
    parse_timestamp,
)
from memories.services import memory_snapshot
from memories.tasks import embed_memories
from memoryhub.errors import DomainError, InvalidInput, NotFound, PayloadTooLarge, QuotaExceeded
from stacks.models import Stack
from stacks.selectors import stack_for_principal, stacks_visible_to
from stacks.services import stack_create, stack_id_validated

logger = logging.getLogger(__name__)

# --- wire vocabulary ---------------------------------------------------------------------------------

# Tables a kernle push may name (§6.4 step 4); `agent_values` is an alias of `values`.
PUSH_TABLES = {table: kind for table, kind in KIND_FOR_TABLE.items() if table != "raw_entries"}
# Tables a 0.15.0 client can apply on pull (§7.3): never raw captures.
PULL_TABLE_FOR_KIND = {
    MemoryKind.EPISODE: "episodes", MemoryKind.NOTE: "notes", MemoryKind.BELIEF: "beliefs",
    MemoryKind.VALUE: "values", MemoryKind.GOAL: "goals", MemoryKind.DRIVE: "drives",
    MemoryKind.RELATIONSHIP: "relationships", MemoryKind.PLAYBOOK: "playbooks",
}
UPSERT_OPERATIONS = frozenset({"update", "insert", "upsert"})

# kernle's SYNC_ARRAY_FIELDS (§7.4): merged as set unions on both sides of a sync.
ARRAY_FIELDS: dict[str, tuple[str, ...]] = {
    MemoryKind.EPISODE: ("lessons", "tags", "emotional_tags", "source_episodes", "derived_from", "context_tags"),
    MemoryKind.NOTE: ("tags", "source_episodes", "derived_from", "context_tags"),
    MemoryKind.BELIEF: ("source_episodes", "derived_from", "context_tags"),
    MemoryKind.VALUE: ("source_episodes", "derived_from", "context_tags"),
    MemoryKind.GOAL: ("source_episodes", "derived_from", "context_tags"),
    MemoryKind.RELATIONSHIP: ("source_episodes", "derived_from", "context_tags"),
    MemoryKind.DRIVE: ("focus_areas", "source_episodes", "derived_from", "context_tags"),
    MemoryKind.PLAYBOOK: ("trigger_conditions", "failure_modes", "recovery_steps", "source_episodes", "tags"),
    MemoryKind.RAW: (),
}
# kernle caps unions at 500 (MAX_SYNC_ARRAY_SIZE); our schema accepts at most LIST_ITEMS per list,
# so a union is capped at the smaller of the two — a merge must never make a record invalid.
ARRAY_CAP = min(500, LIST_ITEMS)

# Keys the sync engine interprets itself and never hands to the schema as client data.
_SYNC_KEYS = frozenset({"version", "deleted", "is_forgotten", "forgotten_at", "forgotten_reason",
                        "local_updated_at", "cloud_synced_at", "id", "stack_id"})
# Timestamp-valued keys kept inside `data`; a naive one is stored with an explicit UTC offset, because
# we echo it on pull and the client cannot compare naive and aware datetimes (§7.3).
_NAIVE_ISO = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?$")
_TIMESTAMP_KEYS = ("last_verified", "last_interaction", "updated_at", "last_used", "captured_at", "timestamp",
                   "last_accessed", "expires_at")
# A 0.15.0 device fails to apply these without their natural key (§6.4 step 8, §7.4).
_REQUIRED_FOR_PULL = {MemoryKind.DRIVE: "drive_type", MemoryKind.RELATIONSHIP: "entity_name",
                      MemoryKind.PLAYBOOK: "name"}

CLIENT_FORGET_REASON = "client_forget"
NATIVE_MAX_OPERATIONS = 1000
NATIVE_PAGE_DEFAULT = 500
NATIVE_PAGE_MAX = 1000
RECORD_ID_MAX = 200
_CURSOR_PREFIX = "c1:"


# --- the engine's input and output -------------------------------------------------------------------

@dataclass
class SyncOp:
    """One parsed operation, wire-format independent."""

    index: int
    kind: str
    record_id: str
    delete: bool
    payload: dict[str, Any] = field(default_factory=dict)  # client data minus sync/server keys
    client_updated_at: datetime | None = None
    client_version: int | None = None
    created_at: datetime | None = None
    wants_delete: bool = False  # `data.deleted == true` on an update: a soft delete
    wants_forget: bool = False  # strength 0.0 or legacy is_forgotten
    normalized: NormalizedMemory | None = None


@dataclass
class OpResult:
    index: int
    ok: bool
    error: str = ""
    code: str = ""
    fields: dict[str, Any] = field(default_factory=dict)
    version: int | None = None


@dataclass
class _State:
    """A record's state while a batch is applied: the stored row (or a new one) plus bookkeeping."""

    row: Any  # the stored Memory, or a _NewRow until it is first written
    is_new: bool
    original_size: int
    original_live: bool  # counted in memory_count / bytes_used before the batch
    snapshot: dict[str, Any] | None  # before-image for the revision history (existing rows)
    snapshot_version: int
    changed: bool = False  # content changed: new version
    touched: bool = False  # only the change stamp moves (a stale write's echo, §6.4 step 9)
    text_changed: bool = False
    populated: bool = False  # a new row has received its first accepted upsert
    op_indexes: list[int] = field(default_factory=list)
    action: str = "update"
    # The normalised record a new row was filled from: its pre-rendered JSON is reused by the COPY
    # while the row still holds that very `data` / `extra` (checked by identity).
    source: NormalizedMemory | None = None


# --- stack resolution --------------------------------------------------------------------------------

def _bound_slug(principal: Principal) -> str | None:
    if principal.bound_stack_id is None:
        return None
    return Stack.objects.filter(pk=principal.bound_stack_id).values_list("slug", flat=True).first()


def _not_reachable(principal: Principal, slug: str) -> NotFound:
    bound = _bound_slug(principal)
    if bound is not None and bound != slug:
        return NotFound(f"This key is bound to stack '{bound}' and cannot reach stack '{slug}'.",
                        code="stack_not_reachable", fields={"stack_id": ["Not reachable with this key."]})
    return NotFound(f"Stack '{slug}' not found.", code="stack_not_found", fields={"stack_id": ["Not found."]})


def kernle_stack_for_push(principal: Principal, raw_slug: Any) -> tuple[Stack | None, str]:
    """Resolve and lock the stack a kernle push names (§6.4 step 2). Caller is in a transaction.

    Returns (stack, "") or, when a personal account may not provision another stack, (None, the
    quota message) so every upsert of the push becomes a conflict naming the limit (§12.6).
    A stack-bound key naming another stack, or a school key naming a stack its school does not
    have, is a 404 with a clear message and nothing is stored.
    """
    slug = stack_id_validated(raw_slug)
    try:
        return stack_for_principal(principal, slug, write=True, lock=True), ""
    except NotFound:
        if not _may_provision(principal):
            raise _not_reachable(principal, slug) from None
    # Serialise provisioning per organization so two first pushes cannot both pass the stack quota.
    Organization.objects.select_for_update().filter(pk=principal.organization.pk).first()
    try:
        entitlements.ensure_can_create_stack(organization=principal.organization)
    except QuotaExceeded as exc:
        return None, exc.message
    try:
        with transaction.atomic():
            stack_create(organization=principal.organization, slug=slug, kind=Stack.Kind.AGENT,
                         principal=principal)
    except DomainError:
        pass  # created concurrently by another push: lock and use it
    return stack_for_principal(principal, slug, write=True, lock=True), ""


def _may_provision(principal: Principal) -> bool:
    """Only an unbound, writable key of a personal account auto-provisions stacks on first push
    (kernle-protocol.md §6.4 step 2); school stacks are created by the school's admins."""
    return (principal.is_key and principal.bound_stack_id is None and not principal.read_only
            and principal.organization.kind == Organization.Kind.PERSONAL)


def sync_stack_for_read(principal: Principal, raw_slug: Any) -> Stack | None:
    """The stack a kernle pull names, or None when it does not exist yet (an empty change set,
    §7.3). A stack-bound key naming another stack is a 404."""
    slug = stack_id_validated(raw_slug)
    stack = stacks_visible_to(principal).filter(slug=slug).select_related("organization").first()
    if stack is None:
        bound = _bound_slug(principal)
        if bound is not None and bound != slug:
            raise _not_reachable(principal, slug)
    return stack


def _lock_stack_shared(stack: Stack) -> None:
    """FOR SHARE on the stack row: waits for an in-flight push to commit, lets pulls run together."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM stacks_stack WHERE id = %s FOR SHARE", [stack.pk])


def _db_now() -> datetime:
    """The database clock: one clock for every web process, read after the stack lock."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        value: datetime = cursor.fetchone()[0]
    return value


# --- parsing -----------------------------------------------------------------------------------------

class _OpRejected(Exception):
    def __init__(self, message: str, *, code: str = "invalid", fields: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.fields = fields or {}


def _record_id(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _OpRejected("missing or invalid record_id", fields={"record_id": ["Must be a string."]})
    record_id = str(value).strip()
    if not record_id or len(record_id) > RECORD_ID_MAX or "\x00" in record_id:
        raise _OpRejected("missing or invalid record_id",
                          fields={"record_id": [f"1-{RECORD_ID_MAX} characters, no null bytes."]})
    return record_id


def _client_version(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int) and -(2**31) <= value < 2**31:
        return value
    if isinstance(value, float) and value.is_integer() and -(2**31) <= value < 2**31:
        return int(value)
    return None


def _prepare_upsert(op: SyncOp, data: Any, op_time: Any, now: datetime) -> None:
    """Interpret the sync keys of `data`, strip server-controlled fields, validate through the schema."""
    if not isinstance(data, dict):
        raise _OpRejected("Missing data for insert/update", fields={"data": ["Must be an object."]})
    op.client_version = _client_version(data.get("version"))
    op.wants_delete = data.get("deleted") is True
    strength = data.get("strength")
    op.wants_forget = data.get("is_forgotten") is True or (
        isinstance(strength, (int, float)) and not isinstance(strength, bool) and strength == 0.0)
    op.client_updated_at = (parse_timestamp(data.get("local_updated_at")) or parse_timestamp(op_time) or now)
    op.created_at = parse_timestamp(data.get("created_at"))
    op.payload = {k: v for k, v in data.items() if k not in _SYNC_KEYS}
    for key in _TIMESTAMP_KEYS:
        value = op.payload.get(key)
        if isinstance(value, str) and _NAIVE_ISO.match(value):
            # Stored with an explicit offset, so every later pull echoes an aware timestamp (§7.3).
            op.payload[key] = value + "+00:00"
    op.normalized = _normalize(op.kind, op.payload)


def _normalize(kind: str, payload: dict[str, Any]) -> NormalizedMemory:
    try:
        # A drive / relationship / playbook without its natural key is stored, not refused: it is
        # the device's data. It is only kept out of kernle pulls (§6.4 step 8, `_APPLIABLE_SQL`).
        return normalize_memory(kind, payload, natural_key_optional=True)
    except (InvalidInput, PayloadTooLarge) as exc:
        raise _OpRejected(_describe(exc), code=exc.code, fields=exc.fields) from None


def _describe(exc: DomainError) -> str:
    """A conflict reason the CLI shows verbatim: the message plus the offending fields."""
    if not exc.fields:
        return exc.message
    parts = []
    for name, messages in exc.fields.items():
        text = "; ".join(str(m) for m in messages) if isinstance(messages, list) else str(messages)
        parts.append(f"{name}: {text}")
    return f"{exc.message} ({', '.join(parts)})"


# --- the engine --------------------------------------------------------------------------------------

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


def _apply_upsert(state: _State, op: SyncOp, now: datetime) -> None:
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
        row.__dict__.update(values)  # a _NewRow: plain attributes, nothing to compare against
        state.changed = state.text_changed = True
        state.source = op.normalized
    else:
        stored_time = row.client_updated_at
        incoming_time = op.client_updated_at
        stale = stored_time is not None and incoming_time is not None and incoming_time < stored_time
        fields = ARRAY_FIELDS.get(row.kind, ())
        if stale:
            # The stored copy is newer: keep it, take only the incoming list items (set union).
            merged = _wire_view(row)
            _merge_lists(merged, merged, op.payload, fields)
            normalized = _normalize(row.kind, merged) if fields else None
            if normalized is not None:
                changed, text_changed = _assign(row, normalized)
                state.changed |= changed
                state.text_changed |= text_changed
            # The stale device gets the newer copy on its next pull (§6.4 step 9).
            state.touched = True
            return
        payload = op.payload
        if fields:
            stored = _wire_view(row)
            payload = dict(payload)
            _merge_lists(payload, payload, stored, fields)
            normalized = _normalize(row.kind, payload)
        else:
            normalized = op.normalized
        changed, text_changed = _assign(row, normalized)
        if row.client_updated_at != op.client_updated_at or row.client_version != op.client_version:
            row.client_updated_at = op.client_updated_at
            row.client_version = op.client_version
            changed = True
        state.changed |= changed
        state.text_changed |= text_changed
    # Forgetting is the client's to set and (for its own forgets) to undo (§6.4 step 7).
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


# --- the stored rows a batch names ---------------------------------------------------------------------
#
# One probe of the unique (stack, kind, record_id) index per key is what we want: O(batch), whatever
# the stack's size. LATERAL ... LIMIT 1 (the key is unique, so LIMIT changes nothing) keeps the
# planner from flattening it into a join, which it plans as a hash join over the WHOLE stack as soon
# as it believes the stack is small (measured: 20 ms per batch at 20,000 rows, linear in the stack).
# But when the statistics are stale — a fresh table, or a stack that grew faster than autovacuum
# re-analyses it — the planner believes (stack, kind) holds about one row and probes the smaller
# (stack, kind, created_at) index instead, filtering every row of that kind per key (measured:
# 0.85 ms per key at 10,000 rows, 0.4 s per batch). So the plan is checked before it is run
# (`_lookup_existing`): a wrong plan on a large stack refreshes the statistics of the two columns
# that decide it (at most once a minute, ~0.15 s), and if that is not possible the plain join is
# used, which is linear in the stack but never per key.
# The embedding (1.5 kB) and the tsvector are never needed here; raw() leaves them deferred.
_EXISTING_COLUMNS = ", ".join(
    f"m.{f.column}" for f in Memory._meta.concrete_fields if f.column not in ("embedding", "search_vector"))
# Built from the model's column names only; every value is a bound parameter.
_EXISTING_PROBE_SQL = (
    f"SELECT {_EXISTING_COLUMNS} FROM unnest(%s::varchar[], %s::varchar[]) AS k(kind, record_id) "  # noqa: S608
    "CROSS JOIN LATERAL (SELECT * FROM memories_memory m WHERE m.stack_id = %s AND m.kind = k.kind "
    "AND m.record_id = k.record_id LIMIT 1) m"
)
_EXISTING_JOIN_SQL = (
    f"SELECT {_EXISTING_COLUMNS} FROM unnest(%s::varchar[], %s::varchar[]) AS k(kind, record_id) "  # noqa: S608
    "JOIN memories_memory m ON m.stack_id = %s AND m.kind = k.kind AND m.record_id = k.record_id"
)
_UNIQUE_INDEX = "memories_memory_record_unique"
# Below this many rows any plan is cheap; above it a per-key scan of the stack is not.
_PROBE_CHECK_MIN_ROWS = 2000
_ANALYZE_CACHE_KEY = "memories:sync:analyze"
_ANALYZE_INTERVAL_SECONDS = 60
# stack pk -> until when this process trusts the probe's plan for that stack
_probe_trusted_until: dict[int, float] = {}
_PROBE_TRUST_SECONDS = 300.0


def _plan_uses(plan: Any, index_name: str) -> bool:
    if isinstance(plan, list):
        return any(_plan_uses(p, index_name) for p in plan)
    if isinstance(plan, dict):
        return plan.get("Index Name") == index_name or any(
            _plan_uses(v, index_name) for k, v in plan.items() if k in ("Plan", "Plans"))
    return False


def _probe_planned_well(params: list[Any]) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + _EXISTING_PROBE_SQL, params)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    return _plan_uses(plan, _UNIQUE_INDEX)


def _refresh_statistics() -> bool:
    """ANALYZE the two columns the probe's plan depends on, at most once a minute across processes.
    Never waits for a lock (autovacuum may hold it); any failure just means "not refreshed"."""
    try:
        if not cache.add(_ANALYZE_CACHE_KEY, 1, _ANALYZE_INTERVAL_SECONDS):
            return False
    except Exception:  # the cache is an optimisation here, never a reason to fail a push
        return False
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('lock_timeout'), set_config('lock_timeout', '50ms', true)")
            previous = cursor.fetchone()[0]
            cursor.execute("ANALYZE memories_memory (stack_id, kind)")
            cursor.execute("SELECT set_config('lock_timeout', %s, true)", [previous])
    except (DatabaseError, psycopg.Error) as exc:
        logger.info("could not refresh memories statistics before a sync lookup (%s)", type(exc).__name__)
        return False
    logger.info("refreshed memories statistics: a stack outgrew them")
    return True


def _has_statistics() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT EXISTS (SELECT 1 FROM pg_stats WHERE schemaname = current_schema() "
                       "AND tablename = 'memories_memory' AND attname = 'stack_id')")
        return bool(cursor.fetchone()[0])


def _probe_is_safe(stack: Stack, params: list[Any]) -> bool:
    """Will the probe query use the unique index for this stack? Checked with EXPLAIN; a plan seen
    with real statistics is trusted for a while (a growing stack only makes it more certain), one
    seen without them is not (it flips as the table grows: measured at ~2,000 rows)."""
    if _probe_trusted_until.get(stack.pk, 0.0) > time.monotonic():
        return True
    with_statistics = _has_statistics() or (_refresh_statistics() and _has_statistics())
    if not _probe_planned_well(params):
        if not (_refresh_statistics() and _probe_planned_well(params)):
            return False
        with_statistics = _has_statistics()
    if with_statistics:
        if len(_probe_trusted_until) > 10_000:
            _probe_trusted_until.clear()
        _probe_trusted_until[stack.pk] = time.monotonic() + _PROBE_TRUST_SECONDS
    return True


def _lookup_existing(stack: Stack, keys: set[tuple[str, str]]) -> Iterable[Memory]:
    kinds, record_ids = zip(*keys, strict=True)
    # Arrays passed as one literal each: adapting 1,000 separate strings costs ~2 ms per batch.
    params = [_array_literal(kinds), _array_literal(record_ids), stack.pk]
    # Over a small stack a join costs no more than probes, whatever its plan.
    probe = stack.memory_count >= _PROBE_CHECK_MIN_ROWS and _probe_is_safe(stack, params)
    return Memory.objects.raw(_EXISTING_PROBE_SQL if probe else _EXISTING_JOIN_SQL, params)


def _apply_batch(*, stack: Stack, ops: list[SyncOp], results: list[OpResult], now: datetime,
                 storage_limited: bool, strict_quota: bool, per_record: bool) -> list[uuid.UUID | str]:
    """Apply parsed operations (caller holds the stack lock, inside a transaction).

    `results` is indexed by op.index and already holds the parse-time rejections. Returns the ids
    of memories whose text changed (to embed after commit). With `strict_quota` (native API) a
    batch that would exceed the storage quota raises QuotaExceeded; otherwise each growing
    operation past the quota becomes that operation's conflict (kernle, §12.6).
    """
    keys = {(op.kind, op.record_id) for op in ops}
    states: dict[tuple[str, str], _State] = {}
    if keys:
        for row in _lookup_existing(stack, keys):
            live = row.deleted_at is None
            states[(row.kind, row.record_id)] = _State(
                row=row, is_new=False, original_size=row.size_bytes if live else 0, original_live=live,
                snapshot=None, snapshot_version=row.version)

    remaining = entitlements.storage_remaining(organization=stack.organization) if storage_limited else None
    added_bytes = 0
    for op in ops:
        key = (op.kind, op.record_id)
        state = states.get(key)
        if op.delete and state is None:
            results[op.index] = OpResult(index=op.index, ok=True)  # never seen: acknowledged (§6.4 step 6)
            continue
        if state is None:
            state = _State(row=_blank_memory(stack, op.kind, op.record_id, now),
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
                _apply_upsert(state, op, now)
        except _OpRejected as rejected:
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

    written = _write_states(stack, [s for s in states.values() if s.op_indexes], now, results, per_record)
    _log_unappliable(stack, written)
    for state in written:
        for index in state.op_indexes:
            if results[index].ok:
                results[index].version = state.row.version
    return [s.row.pk for s in written if s.text_changed and s.row.deleted_at is None]


def _log_unappliable(stack: Stack, written: list[_State]) -> None:
    """Say so when a record was stored that no kernle 0.15.0 device could apply (§6.4 step 8)."""
    for state in written:
        key = _REQUIRED_FOR_PULL.get(state.row.kind)
        if key is None or not state.changed or state.row.deleted_at is not None:
            continue
        value = state.row.data.get(key)
        if not (isinstance(value, str) and value.strip(" ")):  # as `_APPLIABLE_SQL` (btrim) judges it
            logger.warning("sync stored %s %r in stack %s without `%s`: kept, but left out of kernle pulls "
                           "(a kernle 0.15.0 device cannot apply it)", state.row.kind, state.row.record_id,
                           stack.pk, key)


class _NewRow:
    """A memory that does not exist yet, as plain attributes named like Memory's (attnames).

    A push of 500 new memories would otherwise build 500 model instances, and Django's model
    constructor (defaults, descriptors) costs more than everything else we do per record. It is
    written with COPY (`_insert_new`) and never needs to be a model instance.
    """

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__ = values  # the caller's fresh dict becomes the row: no copy

    @property
    def pk(self) -> Any:
        return self.__dict__["id"]


_DEFAULTS: dict[str, Any] | None = None
_MUTABLE_DEFAULTS: list[str] = []


def _blank_memory(stack: Stack, kind: str, record_id: str, now: datetime) -> _NewRow:
    """A new memory with every model default (mutable ones copied), a fresh id and its keys."""
    global _DEFAULTS
    if _DEFAULTS is None:
        fresh = Memory()
        # __dict__, not getattr: the generated search_vector is deferred and would hit the database.
        _DEFAULTS = {f.attname: fresh.__dict__.get(f.attname) for f in Memory._meta.concrete_fields
                     if f.attname != "search_vector"}
        _MUTABLE_DEFAULTS.extend(name for name, v in _DEFAULTS.items() if isinstance(v, (list, dict)))
    values = _DEFAULTS.copy()
    for name in _MUTABLE_DEFAULTS:
        values[name] = type(values[name])()  # every mutable default of Memory is empty
    # As text: what COPY sends and the embedding job takes.
    values.update(id=str(uuid.uuid4()), stack_id=stack.pk, kind=kind, record_id=record_id, server_updated_at=now)
    return _NewRow(values)


def _size_of(state: _State) -> int:
    return 0 if state.row.deleted_at is not None else state.row.size_bytes


_RESTORABLE = ("text", "data", "extra", "tags", "confidence", "source_type", "source_entity", "derived_from",
               "source_episodes", "emotional_valence", "emotional_arousal", "emotional_tags", "subject_ids",
               "access_grants", "consent_grants", "strength", "times_accessed", "last_accessed", "is_protected",
               "expires_at", "size_bytes", "client_updated_at", "client_version", "created_at", "forgotten_at",
               "forgotten_reason", "deleted_at")


_FLAGS = ("changed", "touched", "text_changed", "action", "populated")


def _image(state: _State) -> dict[str, Any]:
    """Everything an operation may change, so a rejected operation leaves no trace in the batch."""
    image = {name: getattr(state.row, name) for name in _RESTORABLE if name in state.row.__dict__}
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
    again record by record (`_with_retry_per_record`)."""


def _with_retry_per_record(apply: Callable[[bool], _Result]) -> _Result:
    """Run `apply(per_record)` in its own transaction: first set-based with no savepoint, and only
    if the database refuses that write (a rejection we could not foresee), once more from the start
    with each record in its own savepoint, so one failing record never rolls back the others.
    WHY not a savepoint around the set-based write: it costs two round trips on every push (~5 ms
    each on a busy box), for a case that almost never happens."""
    try:
        with transaction.atomic():
            return apply(False)
    except _BatchRefused:
        logger.warning("a sync batch was refused by the database; applying it again record by record")
    with transaction.atomic():
        return apply(True)


def _write_states(stack: Stack, states: list[_State], now: datetime, results: list[OpResult],
                  per_record: bool) -> list[_State]:
    """Persist the batch set-based, or (`per_record`) one savepoint per record."""
    for state in states:
        if state.changed or state.touched:
            if not state.is_new and state.changed:
                state.row.version = state.snapshot_version + 1
            if state.text_changed:
                state.row.embedded_version = None  # awaiting (re-)embedding
            state.row.server_updated_at = now
    pending = [s for s in states if s.changed or s.touched]
    if not per_record:
        try:
            _persist(stack, pending)
        except (DatabaseError, psycopg.Error) as exc:
            raise _BatchRefused(stack.pk) from exc
        written = pending
    else:
        written = []
        for state in pending:
            try:
                with transaction.atomic():
                    _persist(stack, [state])
                written.append(state)
            except (DatabaseError, psycopg.Error) as exc:
                logger.warning("sync record refused by the database: %s", type(exc).__name__)
                for index in state.op_indexes:
                    results[index] = OpResult(index=index, ok=False, code="not_stored",
                                              error="the record could not be stored; check its fields")
                state.op_indexes = []
    _update_counters(stack, written, now)
    unchanged = [s for s in states if not (s.changed or s.touched)]
    return written + unchanged


def _persist(stack: Stack, states: list[_State]) -> None:
    new_states = [s for s in states if s.is_new]
    if new_states:
        _insert_new(new_states)
    updated = [s for s in states if not s.is_new]
    if updated:
        for state in updated:
            state.row.change_seq = NextChangeSeq()
        Memory.objects.bulk_update([s.row for s in updated], _UPDATE_FIELDS)
        revisions = [
            MemoryRevision(memory=s.row, version=s.snapshot_version, source="sync", action=s.action,
                           snapshot=s.snapshot or {})
            for s in updated if s.changed
        ]
        if revisions:
            MemoryRevision.objects.bulk_create(revisions)


_UPDATE_FIELDS = [*_RESTORABLE, "version", "server_updated_at", "change_seq", "embedded_version"]

# New rows go in with COPY: Django's bulk_create spends ~1 ms per row building one giant
# parameterised INSERT, several times what Postgres needs to store it. `change_seq` (nextval),
# `search_vector` (generated) and `embedding` (NULL until embedded) come from the database.
_COPY_COLUMNS = ("id", "stack_id", "kind", "record_id", "text", "data", "extra", "tags", "confidence", "source_type",
                 "source_entity", "derived_from", "source_episodes", "emotional_valence", "emotional_arousal",
                 "emotional_tags", "subject_ids", "access_grants", "consent_grants", "strength", "times_accessed",
                 "last_accessed", "is_protected", "stability", "difficulty", "last_reviewed_at", "salience",
                 "forgotten_at", "forgotten_reason", "deleted_at", "expires_at", "version", "client_version",
                 "client_updated_at", "created_at", "server_updated_at", "embedding_model", "embedded_version",
                 "size_bytes")
# Arrays and JSON are sent pre-rendered as text (the server parses them into text[] / jsonb):
# psycopg's own list dumper inspects every list to guess its element type.
_ARRAY_COLUMNS = frozenset({"tags", "derived_from", "source_episodes", "emotional_tags", "subject_ids",
                            "access_grants", "consent_grants"})
_JSON_COLUMNS = frozenset({"data", "extra"})
_COPY_TYPES = tuple(
    # Arrays, JSON and new ids (strings, see _blank_memory) go as text: the server parses them.
    "text" if c in _ARRAY_COLUMNS or c in _JSON_COLUMNS or c == "id" else t
    for c, t in zip(_COPY_COLUMNS, (
        "uuid", "int8", "varchar", "varchar", "text", "jsonb", "jsonb", "text[]", "float8", "varchar", "varchar",
        "text[]", "text[]", "float8", "float8", "text[]", "text[]", "text[]", "text[]", "float8", "int4",
        "timestamptz", "bool", "float8", "float8", "timestamptz", "float8", "timestamptz", "varchar",
        "timestamptz", "timestamptz", "int4", "int4", "timestamptz", "timestamptz", "timestamptz", "varchar",
        "int4", "int4"), strict=True)
)
_DATABASE_FILLED = frozenset({"change_seq", "search_vector", "embedding"})


def _copy_matches_model() -> bool:
    """True while _COPY_COLUMNS covers every column of Memory; a new column falls back to the ORM."""
    columns = {f.column for f in Memory._meta.concrete_fields} - _DATABASE_FILLED
    return columns == set(_COPY_COLUMNS)


_COPY_OK = _copy_matches_model()
_copy_values = operator.itemgetter(*_COPY_COLUMNS)


def _insert_new(states: list[_State]) -> None:
    if not _COPY_OK:
        logger.warning("memories_memory has columns the sync COPY does not know; using bulk_create")
        Memory.objects.bulk_create([Memory(**vars(s.row)) for s in states])
        return
    json_positions = [i for i, c in enumerate(_COPY_COLUMNS) if c in _JSON_COLUMNS]
    array_positions = [i for i, c in enumerate(_COPY_COLUMNS) if c in _ARRAY_COLUMNS]
    statement = f"COPY memories_memory ({', '.join(_COPY_COLUMNS)}) FROM STDIN"
    with connection.cursor() as django_cursor:
        raw_cursor = django_cursor.cursor  # the psycopg cursor, inside Django's transaction
        with raw_cursor.copy(statement) as copy:
            copy.set_types(list(_COPY_TYPES))
            for state in states:
                attributes = state.row.__dict__
                values = list(_copy_values(attributes))  # attribute names == columns here
                source = state.source
                for i in json_positions:
                    value = values[i]
                    # The JSON rendered while validating, while the row still holds that very object.
                    if source is not None and value is source.data and source.data_json is not None:
                        values[i] = source.data_json
                    elif source is not None and value is source.extra and source.extra_json is not None:
                        values[i] = source.extra_json
                    else:
                        values[i] = json.dumps(value, ensure_ascii=False)
                for i in array_positions:
                    values[i] = _array_literal(values[i])
                copy.write_row(values)


def _array_literal(items: list[str] | tuple[str, ...]) -> str:
    """A Postgres text[] literal; every element quoted, so commas, braces and NULL stay text."""
    if not items:
        return "{}"
    quoted = ('"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"' for item in items)
    return "{" + ",".join(quoted) + "}"


def _update_counters(stack: Stack, written: list[_State], now: datetime) -> None:
    count_delta = 0
    bytes_delta = 0
    for state in written:
        live = state.row.deleted_at is None
        count_delta += int(live) - int(state.original_live)
        bytes_delta += (state.row.size_bytes if live else 0) - state.original_size
    with connection.cursor() as cursor:
        cursor.execute("UPDATE stacks_stack SET memory_count = memory_count + %s, bytes_used = bytes_used + %s, "
                       "last_sync_at = %s WHERE id = %s", [count_delta, bytes_delta, now, stack.pk])


# --- Kernle push ---------------------------------------------------------------------------------------

@dataclass
class KernlePushResult:
    synced: int
    conflicts: list[dict[str, Any]]
    acknowledged: list[dict[str, Any]]
    server_time: datetime


def _wire_key(raw_op: Any) -> tuple[Any, Any, Any]:
    if not isinstance(raw_op, dict):
        return None, None, None
    table = raw_op.get("table")
    record_id = raw_op.get("record_id")
    operation = raw_op.get("operation")
    return (table if isinstance(table, str) else None,
            record_id if isinstance(record_id, (str, int)) and not isinstance(record_id, bool) else None,
            operation if isinstance(operation, str) else None)


def _parse_kernle_op(index: int, raw: Any, now: datetime) -> SyncOp:
    if not isinstance(raw, dict):
        raise _OpRejected("operation must be an object")
    table = raw.get("table")
    kind = PUSH_TABLES.get(table) if isinstance(table, str) else None
    if kind is None:
        raise _OpRejected("unsupported table", code="unsupported_table")
    operation = raw.get("operation")
    operation = operation.lower() if isinstance(operation, str) else operation
    if operation != "delete" and operation not in UPSERT_OPERATIONS:
        raise _OpRejected(f"unsupported operation {operation!r}", code="unsupported_operation")
    op = SyncOp(index=index, kind=kind, record_id=_record_id(raw.get("record_id")), delete=operation == "delete")
    if not op.delete:
        if raw.get("data") is None:
            raise _OpRejected("Missing data for insert/update", code="missing_data")
        _prepare_upsert(op, raw.get("data"), raw.get("local_updated_at"), now)
    return op


def kernle_push(*, principal: Principal, stack_id: Any, operations: list[Any]) -> KernlePushResult:
    """Apply a kernle push (kernle-protocol.md §6). Whole-request errors are raised before any write
    (invalid stack id 400, unreachable stack 404, read-only key 403, archived stack 409); every
    other problem is one operation's conflict."""
    return _with_retry_per_record(lambda per_record: _kernle_push(principal, stack_id, operations, per_record))


def _kernle_push(principal: Principal, stack_id: Any, operations: list[Any], per_record: bool) -> KernlePushResult:
    stack, stack_refusal = kernle_stack_for_push(principal, stack_id)
    now = _db_now()
    results: list[OpResult] = [OpResult(index=i, ok=False) for i in range(len(operations))]
    parsed: list[SyncOp] = []
    for index, raw in enumerate(operations):
        try:
            op = _parse_kernle_op(index, raw, now)
        except _OpRejected as rejected:
            results[index] = OpResult(index=index, ok=False, error=rejected.message, code=rejected.code,
                                      fields=rejected.fields)
            continue
        if stack is None and not op.delete:
            results[index] = OpResult(index=index, ok=False, error=stack_refusal, code="stack_limit_reached")
            continue
        if stack is None:
            results[index] = OpResult(index=index, ok=True)  # nothing to delete in a stack that does not exist
            continue
        parsed.append(op)
    changed_ids: list[uuid.UUID | str] = []
    if stack is not None:
        changed_ids = _apply_batch(stack=stack, ops=parsed, results=results, now=now,
                                   storage_limited=True, strict_quota=False, per_record=per_record)
        schedule_embeddings_after_commit(changed_ids)

    conflicts: list[dict[str, Any]] = []
    acknowledged: list[dict[str, Any]] = []
    for index, raw in enumerate(operations):
        table, record_id, operation = _wire_key(raw)
        if results[index].ok:
            acknowledged.append({"table": table, "record_id": str(record_id)})
        else:
            conflicts.append({"table": table, "record_id": None if record_id is None else str(record_id),
                              "operation": operation, "error": results[index].error or "rejected"})
    return KernlePushResult(synced=len(operations) - len(conflicts), conflicts=conflicts,
                            acknowledged=acknowledged, server_time=now)


# One broker message per push (up to this many ids) instead of one per 64: each publish costs a few
# milliseconds on the request path, and a push of 500 new memories is one unit of embedding work.
EMBED_MESSAGE_IDS = 500


def schedule_embeddings_after_commit(memory_ids: Iterable[uuid.UUID | str]) -> None:
    """Embedding is never inline (§6.2): queue it once the push has committed. A lost message only
    delays it (the rows keep `embedded_version IS NULL` and the periodic sweep embeds them), so a
    broker failure is logged, never raised into an already-committed push."""
    ids = [str(i) for i in memory_ids]
    if not ids:
        return

    def send() -> None:
        try:
            for start in range(0, len(ids), EMBED_MESSAGE_IDS):
                embed_memories.delay(ids[start:start + EMBED_MESSAGE_IDS])
        except Exception as exc:  # broker down: the sweep is the safety net
            logger.warning("could not queue embedding after sync (%s); the sweep will pick it up",
                           type(exc).__name__)

    transaction.on_commit(send)


# --- Kernle pull ---------------------------------------------------------------------------------------

# Pulls are rendered without decoding records: Postgres hands over each record's `extra` and
# `data` as JSON text and the modelled columns as one json_build_object, and `_record_json` splices
# them into one object. A 10,000-record change set thus costs string joins, not 10,000
# decode/convert/encode round trips (nor jsonb concatenations in the database).
#
# Later keys override earlier ones for JSON readers (Python's json, httpx): extra < data < columns
# < sync block. By construction of memories.schemas the three sets are disjoint anyway.

# The Memory columns a client payload carries (memories.schemas.memory_payload_view's set).
_VIEW_COLUMNS = ("tags", "confidence", "source_type", "source_entity", "derived_from", "source_episodes",
                 "emotional_valence", "emotional_arousal", "emotional_tags", "subject_ids", "access_grants",
                 "consent_grants", "strength", "times_accessed", "last_accessed", "is_protected", "expires_at")
_COLUMNS_JSON = "json_build_object(" + ", ".join(f"'{c}', m.{c}" for c in _VIEW_COLUMNS) + ")::text"
_TABLE_SQL = "CASE m.kind " + " ".join(f"WHEN '{k}' THEN '{t}'" for k, t in PULL_TABLE_FOR_KIND.items()) + " END"
# A 0.15.0 device cannot apply these without their natural key (§6.4 step 8); stored, never pulled.
_APPLIABLE_SQL = " AND ".join(
    f"NOT (m.kind = '{kind}' AND btrim(COALESCE(m.data ->> '{key}', '')) = '')"
    for kind, key in _REQUIRED_FOR_PULL.items()
)
# Built from module constants only; every value is a bound parameter.
_KERNLE_PULL_SQL = f"""
SELECT {_TABLE_SQL}, to_json(m.record_id)::text,
       CASE WHEN m.kind = 'episode' THEN COALESCE(m.data -> 'lessons', '[]'::jsonb)::text END,
       m.extra::text, m.data::text, {_COLUMNS_JSON},
       json_build_object('id', m.record_id, 'created_at', m.created_at,
                         'local_updated_at', COALESCE(m.client_updated_at, m.server_updated_at),
                         'cloud_synced_at', m.server_updated_at,
                         'version', COALESCE(m.client_version, 1))::text,
       to_json(COALESCE(m.client_updated_at, m.server_updated_at))::text,
       COALESCE(m.client_version, 1)
FROM memories_memory m
WHERE m.stack_id = %(stack)s AND m.deleted_at IS NULL AND m.forgotten_at IS NULL
  AND m.kind IN ({", ".join(f"'{k}'" for k in PULL_TABLE_FOR_KIND)})
  AND (%(since)s::timestamptz IS NULL OR m.server_updated_at > %(since)s::timestamptz)
  AND {_APPLIABLE_SQL}
ORDER BY m.change_seq
"""  # noqa: S608


def _record_json(*objects: str | None) -> str:
    """Splice JSON object texts into one object (later keys win for JSON readers)."""
    inner = [obj[1:-1] for obj in objects if obj and len(obj) > 2]
    return "{" + ", ".join(inner) + "}"


def _kernle_operation_json(row: tuple[Any, ...]) -> str:
    table, record_id, lessons, extra, data, columns, sync_block, local_updated_at, version = row
    head = '{"lessons_learned": ' + lessons + "}" if lessons is not None else None
    return (f'{{"operation": "update", "table": "{table}", "record_id": {record_id}, '
            f'"local_updated_at": {local_updated_at}, "version": {version}, '
            f'"data": {_record_json(head, extra, data, columns, sync_block)}}}')


@dataclass
class KernlePullResult:
    operations_json: str  # a JSON array of pull operations, rendered without decoding records
    count: int
    server_time: datetime

    @property
    def operations(self) -> list[dict[str, Any]]:
        parsed: list[dict[str, Any]] = json.loads(self.operations_json)
        return parsed


@transaction.atomic
def kernle_pull(*, principal: Principal, stack_id: Any, since: Any) -> KernlePullResult:
    """The complete change set since the client's clock (§7.3, §7.6). `since` absent or null: all."""
    # An unreadable `since` is treated as absent: re-sending everything is harmless, skipping is not.
    since_time = parse_timestamp(since) if since is not None else None
    stack = sync_stack_for_read(principal, stack_id)
    if stack is None:
        return KernlePullResult(operations_json="[]", count=0, server_time=timezone.now())
    _lock_stack_shared(stack)
    now = _db_now()
    effective = since_time
    if since_time is not None:
        watermark = (SyncWatermark.objects.filter(stack=stack, credential_id=principal.credential_id)
                     .values_list("pulled_at", flat=True).first())
        # The client's clock may be ahead of ours, and a commit may have raced its last pull; the
        # earlier of its clock and our record of its last read never skips a change (§7.6).
        effective = min(since_time, watermark) if watermark is not None else since_time
    with connection.cursor() as cursor:
        cursor.execute(_KERNLE_PULL_SQL, {"stack": stack.pk, "since": effective})
        rows = [_kernle_operation_json(row) for row in cursor.fetchall()]
    SyncWatermark.objects.update_or_create(stack=stack, credential_id=principal.credential_id,
                                           defaults={"pulled_at": now})
    return KernlePullResult(operations_json="[" + ",".join(rows) + "]", count=len(rows), server_time=now)


# --- native push -----------------------------------------------------------------------------------------

@dataclass
class NativePushResult:
    results: list[dict[str, Any]]
    applied: int
    rejected: int
    server_time: datetime


def _parse_native_op(index: int, raw: Any, now: datetime) -> SyncOp:
    if not isinstance(raw, dict):
        raise _OpRejected("An operation must be an object.")
    kind = raw.get("kind")
    if kind not in MemoryKind.values:
        raise _OpRejected("Unknown memory kind.", code="unsupported_kind",
                          fields={"kind": [f"One of: {', '.join(MemoryKind.values)}."]})
    action = raw.get("op", "upsert")
    if action not in ("upsert", "delete"):
        raise _OpRejected("Unknown operation.", code="unsupported_operation", fields={"op": ["upsert or delete."]})
    op = SyncOp(index=index, kind=kind, record_id=_record_id(raw.get("record_id")), delete=action == "delete")
    if not op.delete:
        if raw.get("data") is None:
            raise _OpRejected("An upsert needs data.", code="missing_data", fields={"data": ["Required."]})
        _prepare_upsert(op, raw.get("data"), raw.get("updated_at"), now)
    return op


def native_push(*, principal: Principal, stack_slug: str, operations: Any) -> NativePushResult:
    """Apply up to NATIVE_MAX_OPERATIONS operations to one stack, in order, each on its own.

    Over the storage quota the whole batch is refused (402 naming the limit) and nothing is stored.
    """
    return _with_retry_per_record(lambda per_record: _native_push(principal, stack_slug, operations, per_record))


def _native_push(principal: Principal, stack_slug: str, operations: Any, per_record: bool) -> NativePushResult:
    if not isinstance(operations, list):
        raise InvalidInput("operations must be a list.", fields={"operations": ["Must be a list."]})
    if len(operations) > NATIVE_MAX_OPERATIONS:
        raise PayloadTooLarge(f"At most {NATIVE_MAX_OPERATIONS} operations per push.",
                              fields={"operations": [f"At most {NATIVE_MAX_OPERATIONS} (got {len(operations)})."]})
    stack = stack_for_principal(principal, stack_slug, write=True, lock=True)
    now = _db_now()
    results: list[OpResult] = [OpResult(index=i, ok=False) for i in range(len(operations))]
    parsed: list[SyncOp] = []
    for index, raw in enumerate(operations):
        try:
            parsed.append(_parse_native_op(index, raw, now))
        except _OpRejected as rejected:
            results[index] = OpResult(index=index, ok=False, error=rejected.message, code=rejected.code,
                                      fields=rejected.fields)
    changed_ids = _apply_batch(stack=stack, ops=parsed, results=results, now=now, storage_limited=True,
                               strict_quota=True, per_record=per_record)
    schedule_embeddings_after_commit(changed_ids)
    body = []
    for index, raw in enumerate(operations):
        result = results[index]
        entry: dict[str, Any] = {
            "index": index,
            "kind": raw.get("kind") if isinstance(raw, dict) else None,
            "record_id": _wire_key(raw)[1],
            "status": "applied" if result.ok else "rejected",
        }
        if result.ok:
            entry["version"] = result.version
        else:
            entry["error"] = {"code": result.code or "invalid", "message": result.error, "fields": result.fields}
        body.append(entry)
    applied = sum(1 for r in results if r.ok)
    return NativePushResult(results=body, applied=applied, rejected=len(results) - applied, server_time=now)


# --- native pull -----------------------------------------------------------------------------------------

def cursor_encode(change_seq: int) -> str:
    return base64.urlsafe_b64encode(f"{_CURSOR_PREFIX}{change_seq}".encode()).decode().rstrip("=")


def cursor_decode(cursor: str | None) -> int:
    """0 for "from the beginning"; InvalidInput for anything we did not issue."""
    if not cursor:
        return 0
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        text = base64.urlsafe_b64decode(padded.encode("ascii")).decode("ascii")
        if not text.startswith(_CURSOR_PREFIX):
            raise ValueError(text)
        value = int(text[len(_CURSOR_PREFIX):])
        if value < 0:
            raise ValueError(text)
        return value
    except (ValueError, UnicodeError, binascii.Error):
        raise InvalidInput("Invalid cursor.", code="invalid_cursor",
                           fields={"cursor": ["Pass back a next_cursor this API returned."]}) from None


# Built from module constants only; every value is a bound parameter. The page is cut first (the
# inner query walks the (stack, change_seq) index), then rendered. The inner query carries only the
# columns rendered: not the embedding (1.5 kB) nor the tsvector, which a page would otherwise copy
# through its Limit (and, on a small table where the planner prefers a sort, through the sort).
_NATIVE_PULL_COLUMNS = ", ".join((
    "change_seq", "deleted_at", "id", "kind", "record_id", "version", "client_version", "created_at",
    "client_updated_at", "server_updated_at", "forgotten_at", "extra", "data", *_VIEW_COLUMNS))
_NATIVE_PULL_SQL = f"""
SELECT m.change_seq,
       json_build_object(
           'op', CASE WHEN m.deleted_at IS NULL THEN 'upsert' ELSE 'delete' END,
           'id', m.id, 'kind', m.kind, 'record_id', m.record_id, 'version', m.version,
           'client_version', m.client_version, 'created_at', m.created_at, 'updated_at', m.client_updated_at,
           'server_updated_at', m.server_updated_at, 'forgotten', m.forgotten_at IS NOT NULL,
           'forgotten_at', m.forgotten_at)::text,
       CASE WHEN m.deleted_at IS NULL THEN m.extra::text END,
       CASE WHEN m.deleted_at IS NULL THEN m.data::text END,
       CASE WHEN m.deleted_at IS NULL THEN {_COLUMNS_JSON} END
FROM (SELECT {_NATIVE_PULL_COLUMNS} FROM memories_memory
      WHERE stack_id = %(stack)s AND change_seq > %(after)s
      ORDER BY stack_id, change_seq LIMIT %(limit)s) m
ORDER BY m.change_seq
"""  # noqa: S608


def _native_change_json(row: tuple[Any, ...]) -> str:
    _, envelope, extra, data, columns = row
    return envelope[:-1] + ', "data": ' + _record_json(extra, data, columns) + "}"


@dataclass
class NativePullResult:
    changes_json: str  # a JSON array of changes, rendered without decoding records
    count: int
    next_cursor: str
    has_more: bool

    @property
    def changes(self) -> list[dict[str, Any]]:
        parsed: list[dict[str, Any]] = json.loads(self.changes_json)
        return parsed


@transaction.atomic
def native_pull(*, principal: Principal, stack_slug: str, cursor: str | None, limit: Any) -> NativePullResult:
    """One page of a stack's changes after `cursor`, oldest first; deletions come as tombstones.

    Resuming with the returned `next_cursor` continues exactly after the last change delivered:
    the cursor is the `change_seq` of that change, and pushes stamp sequence numbers under the
    stack lock, which this read waits for (FOR SHARE), so no earlier number can commit later.
    """
    after = cursor_decode(cursor)
    page_size = _page_size(limit)
    stack = stack_for_principal(principal, stack_slug)
    _lock_stack_shared(stack)
    with connection.cursor() as db:
        db.execute(_NATIVE_PULL_SQL, {"stack": stack.pk, "after": after, "limit": page_size + 1})
        rows = db.fetchall()
    has_more = len(rows) > page_size
    rows = rows[:page_size]
    last = rows[-1][0] if rows else after
    return NativePullResult(changes_json="[" + ",".join(_native_change_json(r) for r in rows) + "]", count=len(rows),
                            next_cursor=cursor_encode(last), has_more=has_more)


def _page_size(limit: Any) -> int:
    if limit in (None, ""):
        return NATIVE_PAGE_DEFAULT
    try:
        value = int(limit)
    except (TypeError, ValueError):
        raise InvalidInput("limit must be an integer.", fields={"limit": ["Must be an integer."]}) from None
    return max(1, min(NATIVE_PAGE_MAX, value))

