"""Memory, checkpoint and boot-config services: what the native API, smart ingest and promotion call.

The services decide; the write kernel (`memories.writes`) writes. Contract shared by every memory
service (all keyword-only, `@transaction.atomic`):

* the caller has already resolved the stack through `stacks.selectors.stack_for_principal`
  (write=True) — these functions do not check access (except `memory_create_for`, which asks
  `stack_for_principal` itself, inside its transaction, so the decision also takes the stack lock);
* payloads become storable through `memories.writes.hooks.prepare_memory` (the schema, redaction,
  then the registered transforms: → `InvalidInput` with field errors, `PayloadTooLarge`,
  `RedactionRefused` (422) for a CRITICAL secret); nothing is stored when it raises;
* growth is checked with `billing.entitlements.ensure_can_store` before anything is written
  (→ `QuotaExceeded`);
* the write itself — stack change lock, `change_seq`, `server_updated_at`, version bump and
  `MemoryRevision` of the state before a change, `embedded_version = None` and an embedding job
  after commit when text changes, `Stack.memory_count` / `bytes_used`, change listeners — is the
  kernel's (`memories.writes.rows`), identical for every writer.

The sync engine (`memories.sync`) writes through the kernel's set-based form instead of these
services, because a kernle push needs per-operation outcomes and set-based speed.
`source` names the writer ("api", "ingest", "promotion", …) and lands in revisions. `author`
(accounts.authors.Author) is who wrote: the new memory's `written_by`, the revision's `author`
(docs/privacy.md "Provenance"); its agent label is redacted like any text (`hooks.prepare_author`).
Every request path passes its caller's (`request_author`, `author_of`); None is the server's own
write, named after `source` (`job_author(source)`: promotion, smart ingest's follow-ups, reviews).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.authors import Author, job_author
from accounts.principal import Principal
from billing.entitlements import ensure_can_store
from memories.models import BootConfigEntry, Checkpoint, Memory
from memories.privacy.redaction.engine import (
    RedactionRefused,
    SensitiveIdentifier,
    redact_text,
    redact_value,
    refuse_sensitive_identifier,
)
from memories.privacy.redaction.policy import RedactionPolicy, stack_policy
from memories.records.cleaning import clean_json, clean_text
from memories.records.vocabulary import ITEM_MAX, LIST_ITEMS
from memories.writes.columns import CONTENT_COLUMNS
from memories.writes.gate import ensure_accepting_writes
from memories.writes.hooks import prepare_author, prepare_memory
from memories.writes.outbox import BOOT_CONFIG, CHECKPOINT, record_change
from memories.writes.rows import (
    insert_memories,
    lock_stack_changes,
    locked_memory,
    memory_snapshot,
    new_memory,
    save_change,
)
from memoryhub.errors import Conflict, InvalidInput, NotFound, PayloadTooLarge
from stacks.models import Stack
from stacks.selectors import stack_for_principal

BATCH_MAX_ITEMS = 500
RECORD_ID_MAX = 200
FORGET_REASON_MAX = 64
RECOVERED_STRENGTH = 0.2  # kernle's `recover`: back as dormant, not strong (docs/algorithms.md §2.7)


def _author(author: Author | None, source: str, policy: RedactionPolicy) -> Author:
    """The write's author as stored: the caller's, or the server's own named after `source`."""
    return prepare_author(author if author is not None else job_author(source), redaction=policy)


def _clean_record_id(record_id: str | None) -> str | None:
    if record_id is None:
        return None
    if not isinstance(record_id, str) or not record_id.strip():
        raise InvalidInput("Invalid record id.", fields={"record_id": ["Must be a non-empty string."]})
    cleaned = clean_text(record_id).strip()
    if len(cleaned) > RECORD_ID_MAX:
        raise InvalidInput("Invalid record id.", fields={"record_id": [f"At most {RECORD_ID_MAX} characters."]})
    # Stored and returned as sent, never rewritten (the client syncs by it): one holding a secret or
    # an e-mail address is refused, 400 `sensitive_identifier` (docs/privacy.md "Redaction").
    return refuse_sensitive_identifier(cleaned, field="record_id")


@transaction.atomic
def memory_create(*, stack: Stack, kind: str, payload: dict[str, Any], source: str,
                  record_id: str | None = None, author: Author | None = None) -> Memory:
    """Validate and store one new memory. A record id already used for this kind is a 409."""
    return _memory_create(stack=stack, kind=kind, payload=payload, source=source, record_id=record_id,
                          author=author)


def _memory_create(*, stack: Stack, kind: str, payload: dict[str, Any], source: str, record_id: str | None,
                   author: Author | None, stack_locked: bool = False) -> Memory:
    """`memory_create`'s body, inside the caller's atomic block (no savepoint of its own: the
    IntegrityError of a duplicate leaves that block as a Conflict, which rolls it back).
    `stack_locked`: the caller holds the stack row's lock in this transaction already."""
    record_id = _clean_record_id(record_id)
    policy = stack_policy(stack)
    normalized = prepare_memory(kind, payload, redaction=policy)
    written_by = _author(author, source, policy)
    ensure_can_store(stack=stack, additional_bytes=normalized.size_bytes)
    memory = new_memory(stack=stack, normalized=normalized, record_id=record_id, now=timezone.now(),
                        author=written_by)
    try:
        insert_memories(stack=stack, memories=[memory], source=source, stack_locked=stack_locked)
    except IntegrityError as exc:
        raise Conflict("A memory with this record id already exists.", code="duplicate_record",
                       fields={"record_id": ["Already exists for this kind."]}) from exc
    return memory


@transaction.atomic
def memory_create_for(*, principal: Principal, stack_slug: str, kind: str, payload: dict[str, Any], source: str,
                      record_id: str | None = None, author: Author | None = None) -> Memory:
    """`memory_create` on the stack `stack_slug` as `principal` reaches it (the native API's
    `POST …/memories`): the access decision (`stack_for_principal`, write=True) is taken inside the
    write's transaction with the stack row locked, so deciding and taking the write kernel's stack
    lock are one statement instead of two."""
    stack = stack_for_principal(principal, stack_slug, write=True, lock=True)
    return _memory_create(stack=stack, kind=kind, payload=payload, source=source, record_id=record_id,
                          author=author, stack_locked=True)


@transaction.atomic
def memory_batch_create(*, stack: Stack, items: Sequence[dict[str, Any]], source: str,
                        author: Author | None = None) -> list[Memory]:
    """Create many memories, all or nothing.

    Each item is `{"kind": …, "record_id"?: …, <the kind's fields>}`. Every item is validated first;
    any error rejects the whole batch with field errors keyed `items.<index>.<field>` and nothing
    is stored. All-or-nothing because a native client retries a batch as a unit; the sync engine,
    which needs per-operation outcomes, has its own set-based path through the kernel.
    """
    if not isinstance(items, (list, tuple)) or not items:
        raise InvalidInput("A batch needs at least one item.", fields={"items": ["Must be a non-empty list."]})
    if len(items) > BATCH_MAX_ITEMS:
        raise PayloadTooLarge(f"At most {BATCH_MAX_ITEMS} items per batch.",
                              fields={"items": [f"At most {BATCH_MAX_ITEMS} items (got {len(items)})."]})
    now = timezone.now()
    policy = stack_policy(stack)  # once for the batch
    written_by = _author(author, source, policy)
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
            normalized = prepare_memory(kind, {k: v for k, v in item.items() if k not in ("kind", "record_id")},
                                        redaction=policy)
        except RedactionRefused as exc:  # a CRITICAL secret refuses the whole batch (422), naming the item
            raise RedactionRefused(exc.rule, f"items.{index}.{next(iter(exc.fields), 'non_field_errors')}") from None
        except SensitiveIdentifier as exc:  # so does a record id holding a secret (400), keeping its code
            raise SensitiveIdentifier(exc.rule, f"items.{index}.record_id") from None
        except (InvalidInput, PayloadTooLarge) as exc:
            for name, messages in exc.fields.items():
                errors[f"items.{index}.{name}"] = messages
            continue
        if record_id is not None:
            if (kind, record_id) in seen:
                errors[f"items.{index}.record_id"] = ["Repeated within the batch."]
                continue
            seen.add((kind, record_id))
        memories.append(new_memory(stack=stack, normalized=normalized, record_id=record_id, now=now,
                                   author=written_by))
    if errors:
        raise InvalidInput("Some items are invalid; nothing was stored.", fields=errors)
    ensure_can_store(stack=stack, additional_bytes=sum(m.size_bytes for m in memories))
    try:
        insert_memories(stack=stack, memories=memories, source=source)
    except IntegrityError as exc:
        raise Conflict("A record id in the batch already exists; nothing was stored.", code="duplicate_record",
                       fields={"items": ["A record id already exists for its kind."]}) from exc
    return memories


@transaction.atomic
def memory_update(*, memory: Memory, payload: dict[str, Any], source: str, partial: bool = True,
                  client_version: int | None = None, client_updated_at: datetime | None = None,
                  author: Author | None = None, reason: str = "") -> Memory:
    """Apply a change to a memory (PATCH semantics by default). No-op changes keep the version.

    `client_version` / `client_updated_at` are the Kernle echo fields. `reason` is kept on the
    revision (the server's own words, e.g. the guardian request a correction answers).
    """
    policy = stack_policy(memory.stack)  # from the caller's row: its stack (and school) are usually loaded
    # Consent and pause (docs/consent.md), from the same row: the write kernel's gate, before the lock.
    ensure_accepting_writes(memory.stack, source=source)
    changed_by = _author(author, source, policy)
    memory = locked_memory(memory)
    normalized = prepare_memory(memory.kind, payload, redaction=policy, partial=partial, existing=memory)
    new_values = normalized.as_model_fields()
    new_values.pop("created_at", None)  # creation time is fixed once stored
    if client_updated_at is None:
        client_updated_at = new_values.pop("client_updated_at", None)
    else:
        new_values.pop("client_updated_at", None)
    changed = [name for name in CONTENT_COLUMNS if getattr(memory, name) != new_values[name]]
    echo_changed = []
    if client_version is not None and client_version != memory.client_version:
        echo_changed.append("client_version")
    if client_updated_at is not None and client_updated_at != memory.client_updated_at:
        echo_changed.append("client_updated_at")
    if not changed and not echo_changed:
        return memory
    bytes_delta = normalized.size_bytes - memory.size_bytes
    ensure_can_store(stack=memory.stack, additional_bytes=bytes_delta)
    before = memory_snapshot(memory)
    text_changed = memory.text != normalized.text
    for name in changed:
        setattr(memory, name, new_values[name])
    if client_version is not None:
        memory.client_version = client_version
    if client_updated_at is not None:
        memory.client_updated_at = client_updated_at
    return save_change(memory, before=before, source=source, author=changed_by, action="update", reason=reason,
                       fields=[*changed, *echo_changed],
                       text_changed=text_changed, bytes_delta=bytes_delta, original_text=normalized.original_text)


@transaction.atomic
def memory_forget(*, memory: Memory, reason: str, source: str = "api", author: Author | None = None) -> Memory:
    """Tombstone a memory: kept, recoverable, excluded from load, search, export and pull.

    Refuses protected memories and memories already forgotten (409), like kernle's `forget`.
    Sets strength to 0.0 too, which is what a forgotten record looks like to a Kernle client.
    """
    policy = stack_policy(memory.stack)  # from the stack the caller resolved, before the re-read
    changed_by = _author(author, source, policy)
    memory = locked_memory(memory)
    if memory.deleted_at is not None:
        raise Conflict("The memory was deleted.", code="memory_deleted")
    if memory.is_protected:
        raise Conflict("The memory is protected; unprotect it first.", code="memory_protected")
    if memory.forgotten_at is not None:
        raise Conflict("The memory is already forgotten.", code="already_forgotten")
    reason = _forget_reason(reason, policy)
    before = memory_snapshot(memory)
    memory.forgotten_at = timezone.now()
    memory.forgotten_reason = reason
    memory.strength = 0.0
    return save_change(memory, before=before, source=source, author=changed_by, action="forget", reason=reason,
                       fields=["forgotten_at", "forgotten_reason", "strength"])


def _forget_reason(reason: str | None, policy: RedactionPolicy) -> str:
    """The reason as stored (the memory's `forgotten_reason` and its revision): redacted like any
    text (a CRITICAL secret: 422), then cut to FORGET_REASON_MAX — after redaction, so no secret is
    cut in two past recognition; a placeholder the cut would split is dropped whole."""
    text = redact_text(clean_text(reason or "").strip(), field="reason", policy=policy)
    if len(text) > FORGET_REASON_MAX:
        text = text[:FORGET_REASON_MAX]
        opened = text.rfind("<REDACTED:")
        if opened != -1 and ">" not in text[opened:]:
            text = text[:opened]
    return text.strip() or "manual"


@transaction.atomic
def memory_recover(*, memory: Memory, source: str = "api", author: Author | None = None) -> Memory:
    """Undo a tombstone. The memory comes back dormant (strength 0.2), as kernle's `recover` does."""
    changed_by = _author(author, source, stack_policy(memory.stack))
    memory = locked_memory(memory)
    if memory.forgotten_at is None:
        raise Conflict("The memory is not forgotten.", code="not_forgotten")
    before = memory_snapshot(memory)
    memory.forgotten_at = None
    memory.forgotten_reason = ""
    memory.strength = max(memory.strength, RECOVERED_STRENGTH)
    return save_change(memory, before=before, source=source, author=changed_by, action="recover",
                       fields=["forgotten_at", "forgotten_reason", "strength"])


@transaction.atomic
def memory_set_protected(*, memory: Memory, protected: bool, source: str = "api",
                         author: Author | None = None) -> Memory:
    """Protect (exempt from decay and forgetting) or unprotect a memory. Idempotent."""
    changed_by = _author(author, source, stack_policy(memory.stack))
    memory = locked_memory(memory)
    if memory.is_protected == protected:
        return memory
    before = memory_snapshot(memory)
    memory.is_protected = protected
    return save_change(memory, before=before, source=source, author=changed_by,
                       action="protect" if protected else "unprotect",
                       fields=["is_protected"])


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
    # The pending items, a list of strings kept in order (kernle's `pending`, the seed's shape).
    pending: Sequence[str] | None = None
    # When the client saved it (kernle's episode time); None: the server's time is all we have.
    saved_at: datetime | None = None
    # The kernle checkpoint episode it was read from (memories.sync.checkpoints); "" for native saves.
    episode_record_id: str = ""


def _checkpoint_pending(pending: Any, errors: dict[str, list[str]]) -> list[str]:
    """The pending items as stored: a list of at most LIST_ITEMS strings of at most ITEM_MAX characters."""
    if pending is None:
        return []
    if not isinstance(pending, (list, tuple)) or not all(isinstance(item, str) for item in pending):
        errors["pending"] = ["Must be a list of strings."]
        return []
    if len(pending) > LIST_ITEMS:
        errors["pending"] = [f"At most {LIST_ITEMS} items."]
        return []
    items = [clean_text(item).strip() for item in pending]
    if any(len(item) > ITEM_MAX for item in items):
        errors["pending"] = [f"Each item at most {ITEM_MAX} characters."]
    return [item for item in items if item]


@transaction.atomic
def checkpoint_save(*, stack: Stack, checkpoint: CheckpointInput, source: str = "api") -> Checkpoint:
    """Store a new checkpoint (history is kept; the newest one is "the" checkpoint), with its
    change event (topic "checkpoint", action "save"). docs/api.md "Checkpoint".

    With `episode_record_id` (a kernle checkpoint episode, docs/kernle-protocol.md §3.12) it is saved
    once per episode: when that episode already has its checkpoint, that one is returned and nothing
    is written (no event), so a re-push of the episode is harmless."""
    ensure_accepting_writes(stack, source=source)  # consent and pause (docs/consent.md)
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
    pending = _checkpoint_pending(checkpoint.pending, errors)
    if errors:
        raise InvalidInput("The checkpoint is invalid.", fields=errors)
    # Redacted like a memory (docs/algorithms.md §11): placeholders, or RedactionRefused (422).
    policy = stack_policy(stack)
    task = redact_value(task, field="task", policy=policy)
    texts = {name: redact_value(value, field=name, policy=policy) for name, value in texts.items()}
    context = redact_value(context, field="context", policy=policy)
    pending = [redact_value(item, field="pending", policy=policy) for item in pending]
    # The stack lock orders this write's event among the stack's others (memories.writes.outbox: seq),
    # and makes "does this episode have its checkpoint yet?" exact.
    lock_stack_changes(stack.pk)
    if checkpoint.episode_record_id:
        existing = Checkpoint.objects.filter(stack=stack, episode_record_id=checkpoint.episode_record_id).first()
        if existing is not None:
            return existing
    saved = Checkpoint.objects.create(stack=stack, task=task, context=context, pending=pending,
                                      saved_at=checkpoint.saved_at,
                                      episode_record_id=checkpoint.episode_record_id, **texts)
    record_change(stack_id=stack.pk, topic=CHECKPOINT, source=source, changes=[("save", ())])
    return saved


# --- boot config -----------------------------------------------------------------------------------

BOOT_KEY_PATTERN = re.compile(r"^[A-Za-z0-9_.:\-]{1,100}$")
BOOT_VALUE_MAX = 10_000
BOOT_MAX_ENTRIES = 200


def _validate_boot_key(key: str) -> str:
    if not isinstance(key, str) or not BOOT_KEY_PATTERN.match(key):
        raise InvalidInput("Invalid boot config key.",
                           fields={"key": ["1-100 characters: letters, digits, '_', '.', ':' or '-'."]})
    # A key name is stored and read back as sent: one holding a secret (`AKIA…` and `knl_sk_…` fit the
    # pattern) is refused, 400 `sensitive_identifier` (docs/privacy.md "Redaction").
    return refuse_sensitive_identifier(key, field="key")


@transaction.atomic
def boot_config_set(*, stack: Stack, key: str, value: Any, source: str = "api") -> BootConfigEntry:
    """Set one key (upsert on the (stack, key) constraint), with its change event (topic
    "boot_config", action "set"; the event names no key: consumers read the config)."""
    ensure_accepting_writes(stack, source=source)  # consent and pause (docs/consent.md)
    key = _validate_boot_key(key)
    if value is None or isinstance(value, (dict, list)):
        raise InvalidInput("Invalid boot config value.", fields={"value": ["Must be a string."]})
    text = clean_text(str(value))
    if len(text) > BOOT_VALUE_MAX:
        raise InvalidInput("Invalid boot config value.", fields={"value": [f"At most {BOOT_VALUE_MAX} characters."]})
    # docs/algorithms.md §11; RedactionRefused (422) for a CRITICAL secret
    text = redact_value(text, field="value", policy=stack_policy(stack))
    lock_stack_changes(stack.pk)  # orders the event (memories.writes.outbox: seq) and the BOOT_MAX_ENTRIES count
    exists = BootConfigEntry.objects.filter(stack=stack, key=key).exists()
    if not exists and BootConfigEntry.objects.filter(stack=stack).count() >= BOOT_MAX_ENTRIES:
        raise InvalidInput("Too many boot config keys.",
                           fields={"key": [f"At most {BOOT_MAX_ENTRIES} keys per stack."]})
    entry, _ = BootConfigEntry.objects.update_or_create(stack=stack, key=key, defaults={"value": text})
    record_change(stack_id=stack.pk, topic=BOOT_CONFIG, source=source, changes=[("set", ())])
    return entry


@transaction.atomic
def boot_config_delete(*, stack: Stack, key: str, source: str = "api") -> None:
    """Remove one key, with its change event ("unset"); a missing key is a 404 so clients notice typos."""
    ensure_accepting_writes(stack, source=source)  # consent and pause (docs/consent.md)
    lock_stack_changes(stack.pk)
    deleted, _ = BootConfigEntry.objects.filter(stack=stack, key=key).delete()
    if not deleted:
        raise NotFound("No such boot config key.", code="boot_key_not_found")
    record_change(stack_id=stack.pk, topic=BOOT_CONFIG, source=source, changes=[("unset", ())])
