"""THE write path for memories, checkpoints and boot config.

Every write — native API, Kernle sync, smart ingest, promotion — goes through these services, so
validation (memories.schemas), quotas (billing.entitlements) and later gates apply everywhere.

Contract shared by every memory service (all keyword-only, `@transaction.atomic`):

* the caller has already resolved the stack through `stacks.selectors.stack_for_principal`
  (write=True) — these functions do not check access;
* payloads are validated by `memories.schemas.normalize_memory` (→ `InvalidInput` with field
  errors, `PayloadTooLarge`); nothing is stored when it raises;
* growth is checked with `billing.entitlements.ensure_can_store` before anything is written
  (→ `QuotaExceeded`);
* every insert and every change stamps `change_seq = NextChangeSeq()` and `server_updated_at`,
  holding the stack's change lock (`lock_stack_changes`) first, so sequence numbers of one stack
  commit in the order they were drawn and a cursor reader never skips one;
  a change bumps `version` by one and keeps a `MemoryRevision` of the state before it; a change
  of text sets `embedded_version = None` ("awaiting embedding") and queues an embedding job
  after commit;
* `Stack.memory_count` / `bytes_used` move with `F()` after commit (`stack_usage_adjust`).

`source` names the writer ("api", "sync", "ingest", "promotion", …) and lands in revisions.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from billing.entitlements import ensure_can_store
from memories.models import BootConfigEntry, Checkpoint, Memory, MemoryRevision, NextChangeSeq
from memories.schemas import NormalizedMemory, clean_json, clean_text, normalize_memory
from memoryhub.errors import Conflict, InvalidInput, NotFound, PayloadTooLarge
from stacks.models import Stack

BATCH_MAX_ITEMS = 500
RECORD_ID_MAX = 200
FORGET_REASON_MAX = 64
RECOVERED_STRENGTH = 0.2  # kernle's `recover`: back as dormant, not strong (memory-science.md §8.6)

# Columns that make up a memory's state; snapshotted into revisions before each change.
_SNAPSHOT_FIELDS = (
    "kind", "record_id", "text", "data", "extra", "tags", "confidence", "source_type", "source_entity",
    "derived_from", "source_episodes", "emotional_valence", "emotional_arousal", "emotional_tags",
    "subject_ids", "access_grants", "consent_grants", "strength", "times_accessed", "last_accessed",
    "is_protected", "forgotten_at", "forgotten_reason", "deleted_at", "expires_at", "version",
    "client_version", "client_updated_at", "created_at", "server_updated_at", "size_bytes",
)


def memory_snapshot(memory: Memory) -> dict[str, Any]:
    """The stored state of a memory as JSON (for revisions)."""
    snapshot: dict[str, Any] = {}
    for name in _SNAPSHOT_FIELDS:
        value = getattr(memory, name)
        snapshot[name] = value.isoformat() if isinstance(value, datetime) else value
    return snapshot


def stack_usage_adjust(*, stack_id: int, count_delta: int, bytes_delta: int) -> None:
    """Move the stack's usage counters once the surrounding transaction commits."""
    if not count_delta and not bytes_delta:
        return

    def apply() -> None:
        Stack.objects.filter(pk=stack_id).update(
            memory_count=F("memory_count") + count_delta, bytes_used=F("bytes_used") + bytes_delta
        )

    transaction.on_commit(apply)


def _queue_embedding(ids: Sequence[uuid.UUID | str]) -> None:
    # Imported late: memories.tasks pulls in Celery; the services must stay importable without it.
    from memories.tasks import enqueue_embedding

    enqueue_embedding(ids)


def _clean_record_id(record_id: str | None) -> str | None:
    if record_id is None:
        return None
    if not isinstance(record_id, str) or not record_id.strip():
        raise InvalidInput("Invalid record id.", fields={"record_id": ["Must be a non-empty string."]})
    cleaned = clean_text(record_id).strip()
    if len(cleaned) > RECORD_ID_MAX:
        raise InvalidInput("Invalid record id.", fields={"record_id": [f"At most {RECORD_ID_MAX} characters."]})
    return cleaned


def _new_memory(*, stack: Stack, normalized: NormalizedMemory, record_id: str | None, now: datetime) -> Memory:
    memory_id = uuid.uuid4()
    fields = normalized.as_model_fields()
    fields.setdefault("created_at", now)
    return Memory(
        id=memory_id, stack=stack, kind=normalized.kind, record_id=record_id or str(memory_id),
        server_updated_at=now, embedded_version=None, **fields,
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


@transaction.atomic
def memory_create(*, stack: Stack, kind: str, payload: dict[str, Any], source: str,
                  record_id: str | None = None) -> Memory:
    """Validate and store one new memory. A record id already used for this kind is a 409."""
    record_id = _clean_record_id(record_id)
    normalized = normalize_memory(kind, payload)
    ensure_can_store(stack=stack, additional_bytes=normalized.size_bytes)
    lock_stack_changes(stack.pk)
    memory = _new_memory(stack=stack, normalized=normalized, record_id=record_id, now=timezone.now())
    try:
        with transaction.atomic():  # savepoint: a duplicate must not poison the caller's transaction
            memory.save(force_insert=True)
    except IntegrityError as exc:
        raise Conflict("A memory with this record id already exists.", code="duplicate_record",
                       fields={"record_id": ["Already exists for this kind."]}) from exc
    stack_usage_adjust(stack_id=stack.pk, count_delta=1, bytes_delta=normalized.size_bytes)
    _queue_embedding([memory.pk])
    return memory


@transaction.atomic
def memory_batch_create(*, stack: Stack, items: Sequence[dict[str, Any]], source: str) -> list[Memory]:
    """Create many memories, all or nothing.

    Each item is `{"kind": …, "record_id"?: …, <the kind's fields>}`. Every item is validated first;
    any error rejects the whole batch with field errors keyed `items.<index>.<field>` and nothing
    is stored. All-or-nothing because a native client retries a batch as a unit; the Kernle
    sync path, which needs per-operation outcomes, calls `memory_create` per operation instead.
    """
    if not isinstance(items, (list, tuple)) or not items:
        raise InvalidInput("A batch needs at least one item.", fields={"items": ["Must be a non-empty list."]})
    if len(items) > BATCH_MAX_ITEMS:
        raise PayloadTooLarge(f"At most {BATCH_MAX_ITEMS} items per batch.",
                              fields={"items": [f"At most {BATCH_MAX_ITEMS} items (got {len(items)})."]})
    now = timezone.now()
    errors: dict[str, Any] = {}
    memories: list[Memory] = []
    seen: set[tuple[str, str]] = set()
    for index, item in enumerate(items):
        try:
            if not isinstance(item, dict):
                raise InvalidInput("Invalid item.", fields={"non_field_errors": ["Expected an object."]})
            kind = item.get("kind")
            if not isinstance(kind, str):
                raise InvalidInput("Invalid item.", fields={"kind": ["This field is required."]})
            record_id = _clean_record_id(item.get("record_id"))
            normalized = normalize_memory(kind, {k: v for k, v in item.items() if k not in ("kind", "record_id")})
        except (InvalidInput, PayloadTooLarge) as exc:
            for name, messages in exc.fields.items():
                errors[f"items.{index}.{name}"] = messages
            continue
        if record_id is not None:
            if (kind, record_id) in seen:
                errors[f"items.{index}.record_id"] = ["Repeated within the batch."]
                continue
            seen.add((kind, record_id))
        memories.append(_new_memory(stack=stack, normalized=normalized, record_id=record_id, now=now))
    if errors:
        raise InvalidInput("Some items are invalid; nothing was stored.", fields=errors)
    total_bytes = sum(m.size_bytes for m in memories)
    ensure_can_store(stack=stack, additional_bytes=total_bytes)
    lock_stack_changes(stack.pk)
    try:
        with transaction.atomic():
            Memory.objects.bulk_create(memories)
    except IntegrityError as exc:
        raise Conflict("A record id in the batch already exists; nothing was stored.", code="duplicate_record",
                       fields={"items": ["A record id already exists for its kind."]}) from exc
    stack_usage_adjust(stack_id=stack.pk, count_delta=len(memories), bytes_delta=total_bytes)
    _queue_embedding([m.pk for m in memories])
    return memories


def _lock(memory: Memory) -> Memory:
    """Re-read the row under a lock so concurrent changes serialise (caller is in a transaction).
    The stack's change lock comes first (see `lock_stack_changes` for the order)."""
    lock_stack_changes(memory.stack_id)
    return Memory.objects.select_for_update().get(pk=memory.pk)


def _save_change(memory: Memory, *, before: dict[str, Any], source: str, action: str, reason: str = "",
                 extra_fields: Sequence[str] = ()) -> Memory:
    """Record the before-state, bump version, stamp the change feed and save the given fields."""
    MemoryRevision.objects.create(memory=memory, version=before["version"], source=source, action=action,
                                  reason=reason, snapshot=before)
    memory.version = F("version") + 1
    memory.change_seq = NextChangeSeq()
    memory.server_updated_at = timezone.now()
    memory.save(update_fields=["version", "change_seq", "server_updated_at", *extra_fields])
    memory.refresh_from_db(fields=["version", "change_seq"])
    return memory


_UPDATABLE = ("text", "data", "extra", "size_bytes", "tags", "confidence", "source_type", "source_entity",
              "derived_from", "source_episodes", "emotional_valence", "emotional_arousal", "emotional_tags",
              "subject_ids", "access_grants", "consent_grants", "strength", "times_accessed",
              "last_accessed", "is_protected", "expires_at")


@transaction.atomic
def memory_update(*, memory: Memory, payload: dict[str, Any], source: str, partial: bool = True,
                  client_version: int | None = None, client_updated_at: datetime | None = None) -> Memory:
    """Apply a change to a memory (PATCH semantics by default). No-op changes keep the version.

    `client_version` / `client_updated_at` are the Kernle echo fields (sync only).
    """
    memory = _lock(memory)
    normalized = normalize_memory(memory.kind, payload, partial=partial, existing=memory)
    new_values = normalized.as_model_fields()
    new_values.pop("created_at", None)  # creation time is fixed once stored
    if client_updated_at is None:
        client_updated_at = new_values.pop("client_updated_at", None)
    else:
        new_values.pop("client_updated_at", None)
    changed = [name for name in _UPDATABLE if getattr(memory, name) != new_values[name]]
    echo_changed = []
    if client_version is not None and client_version != memory.client_version:
        echo_changed.append("client_version")
    if client_updated_at is not None and client_updated_at != memory.client_updated_at:
        echo_changed.append("client_updated_at")
    if not changed and not echo_changed:
        return memory
    ensure_can_store(stack=memory.stack, additional_bytes=normalized.size_bytes - memory.size_bytes)
    before = memory_snapshot(memory)
    bytes_delta = normalized.size_bytes - memory.size_bytes
    text_changed = memory.text != normalized.text
    for name in changed:
        setattr(memory, name, new_values[name])
    if client_version is not None:
        memory.client_version = client_version
    if client_updated_at is not None:
        memory.client_updated_at = client_updated_at
    fields = [*changed, *echo_changed]
    if text_changed:
        memory.embedded_version = None
        fields.append("embedded_version")
    _save_change(memory, before=before, source=source, action="update", extra_fields=fields)
    stack_usage_adjust(stack_id=memory.stack_id, count_delta=0, bytes_delta=bytes_delta)
    if text_changed:
        _queue_embedding([memory.pk])
    return memory


@transaction.atomic
def memory_forget(*, memory: Memory, reason: str, source: str = "api") -> Memory:
    """Tombstone a memory: kept, recoverable, excluded from load, search, export and pull.

    Refuses protected memories and memories already forgotten (409), like kernle's `forget`.
    Sets strength to 0.0 too, which is what a forgotten record looks like to a Kernle client.
    """
    memory = _lock(memory)
    if memory.deleted_at is not None:
        raise Conflict("The memory was deleted.", code="memory_deleted")
    if memory.is_protected:
        raise Conflict("The memory is protected; unprotect it first.", code="memory_protected")
    if memory.forgotten_at is not None:
        raise Conflict("The memory is already forgotten.", code="already_forgotten")
    reason = clean_text(reason or "").strip()[:FORGET_REASON_MAX] or "manual"
    before = memory_snapshot(memory)
    memory.forgotten_at = timezone.now()
    memory.forgotten_reason = reason
    memory.strength = 0.0
    return _save_change(memory, before=before, source=source, action="forget", reason=reason,
                        extra_fields=["forgotten_at", "forgotten_reason", "strength"])


@transaction.atomic
def memory_recover(*, memory: Memory, source: str = "api") -> Memory:
    """Undo a tombstone. The memory comes back dormant (strength 0.2), as kernle's `recover` does."""
    memory = _lock(memory)
    if memory.forgotten_at is None:
        raise Conflict("The memory is not forgotten.", code="not_forgotten")
    before = memory_snapshot(memory)
    memory.forgotten_at = None
    memory.forgotten_reason = ""
    memory.strength = max(memory.strength, RECOVERED_STRENGTH)
    return _save_change(memory, before=before, source=source, action="recover",
                        extra_fields=["forgotten_at", "forgotten_reason", "strength"])


@transaction.atomic
def memory_set_protected(*, memory: Memory, protected: bool, source: str = "api") -> Memory:
    """Protect (exempt from decay and forgetting) or unprotect a memory. Idempotent."""
    memory = _lock(memory)
    if memory.is_protected == protected:
        return memory
    before = memory_snapshot(memory)
    memory.is_protected = protected
    return _save_change(memory, before=before, source=source, action="protect" if protected else "unprotect",
                        extra_fields=["is_protected"])


# --- checkpoints -----------------------------------------------------------------------------------

CHECKPOINT_TASK_MAX = 500
CHECKPOINT_TEXT_MAX = 10_000
CHECKPOINT_CONTEXT_MAX_BYTES = 32 * 1024


@dataclass(frozen=True)
class CheckpointInput:
    task: str
    progress: str = ""
    next_step: str = ""
    blocker: str = ""
    context: dict[str, Any] | None = None


@transaction.atomic
def checkpoint_save(*, stack: Stack, checkpoint: CheckpointInput) -> Checkpoint:
    """Store a new checkpoint (history is kept; the newest one is "the" checkpoint)."""
    errors: dict[str, list[str]] = {}
    task = clean_text(checkpoint.task or "").strip()
    if not task:
        errors["task"] = ["This field may not be blank."]
    elif len(task) > CHECKPOINT_TASK_MAX:
        errors["task"] = [f"At most {CHECKPOINT_TASK_MAX} characters."]
    texts = {}
    for name in ("progress", "next_step", "blocker"):
        value = clean_text(getattr(checkpoint, name) or "")
        if len(value) > CHECKPOINT_TEXT_MAX:
            errors[name] = [f"At most {CHECKPOINT_TEXT_MAX} characters."]
        texts[name] = value
    context = clean_json(checkpoint.context or {})
    if not isinstance(context, dict):
        errors["context"] = ["Must be an object."]
    elif len(json.dumps(context, ensure_ascii=False).encode()) > CHECKPOINT_CONTEXT_MAX_BYTES:
        errors["context"] = [f"At most {CHECKPOINT_CONTEXT_MAX_BYTES} bytes."]
    if errors:
        raise InvalidInput("The checkpoint is invalid.", fields=errors)
    return Checkpoint.objects.create(stack=stack, task=task, context=context, **texts)


# --- boot config -----------------------------------------------------------------------------------

BOOT_KEY_PATTERN = re.compile(r"^[A-Za-z0-9_.:\-]{1,100}$")
BOOT_VALUE_MAX = 10_000
BOOT_MAX_ENTRIES = 200


def _validate_boot_key(key: str) -> str:
    if not isinstance(key, str) or not BOOT_KEY_PATTERN.match(key):
        raise InvalidInput("Invalid boot config key.",
                           fields={"key": ["1-100 characters: letters, digits, '_', '.', ':' or '-'."]})
    return key


@transaction.atomic
def boot_config_set(*, stack: Stack, key: str, value: Any) -> BootConfigEntry:
    """Set one key (upsert on the (stack, key) constraint)."""
    key = _validate_boot_key(key)
    if value is None or isinstance(value, (dict, list)):
        raise InvalidInput("Invalid boot config value.", fields={"value": ["Must be a string."]})
    text = clean_text(str(value))
    if len(text) > BOOT_VALUE_MAX:
        raise InvalidInput("Invalid boot config value.", fields={"value": [f"At most {BOOT_VALUE_MAX} characters."]})
    exists = BootConfigEntry.objects.filter(stack=stack, key=key).exists()
    if not exists and BootConfigEntry.objects.filter(stack=stack).count() >= BOOT_MAX_ENTRIES:
        raise InvalidInput("Too many boot config keys.",
                           fields={"key": [f"At most {BOOT_MAX_ENTRIES} keys per stack."]})
    entry, _ = BootConfigEntry.objects.update_or_create(stack=stack, key=key, defaults={"value": text})
    return entry


@transaction.atomic
def boot_config_delete(*, stack: Stack, key: str) -> None:
    """Remove one key; a missing key is a 404 so clients notice typos."""
    deleted, _ = BootConfigEntry.objects.filter(stack=stack, key=key).delete()
    if not deleted:
        raise NotFound("No such boot config key.", code="boot_key_not_found")
