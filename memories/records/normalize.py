"""Per-kind validation of memory payloads: THE schema every write goes through.

Contract (used by the native API, the Kernle sync engine and smart ingest):

    normalize_memory(kind, payload, *, partial=False, existing=None) -> NormalizedMemory

* `kind` is a `MemoryKind` value ("episode", "value", …). Wire table names are the caller's
  business (`agent_values` → "value" etc.; see `KIND_FOR_TABLE`).
* `payload` is the client's record as a dict: kernle field names and types (docs/kernle-protocol.md
  §3.3). Nulls are accepted for every optional field (they mean "default"). Strings lose null bytes
  and control characters (tab/newline/CR are kept); too-long strings, out-of-range numbers, wrong
  types, bad enum values and text that is not valid Unicode (a lone surrogate, anywhere in the
  record) raise `InvalidInput(fields={field: [message, …]})` — never truncated silently, never a 500.
* Keys we do not model are kept verbatim in `extra` (null bytes removed: Postgres jsonb refuses
  them). That is kernle sync's leniency; the native API refuses such keys before it gets here
  (`memories.records.fields.native_record`: a 400 `unknown_field`, fields of one's own under
  `extra`). Server-controlled keys (`SERVER_CONTROLLED`: id, stack_id, version, deleted, forgotten
  state, embedding, …) are dropped: the caller (sync) interprets `version`/`deleted`/`strength`
  itself before calling.
* `partial=True` with `existing` merges the payload over the stored record and validates the
  result as a whole (PATCH semantics); keys set to null reset to the default.
* The result carries the Memory column values (`columns`: tags, confidence, provenance, emotion,
  privacy, client bookkeeping, is_protected, expires_at, optionally created_at / client_updated_at),
  the kind-specific `data`, `extra`, the canonical `text` (docs/kernle-protocol.md §3.3)
  and `size_bytes` (what the quota counts). Values and drives are protected by default; values
  default to confidence 0.9, every other kind to 0.8.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memories.records.cleaning import NOT_UNICODE, InvalidUnicode, clean_json
from memories.records.reader import FieldErrors, Reader
from memories.records.schemas import PASSTHROUGH, SCHEMAS, canonical_text, common_columns
from memories.records.vocabulary import EXTRA_MAX_BYTES, KINDS, MEMORY_MAX_BYTES, SERVER_CONTROLLED
from memoryhub.errors import InvalidInput, PayloadTooLarge

if TYPE_CHECKING:
    from memories.models import Memory


@dataclass
class NormalizedMemory:
    kind: str
    columns: dict[str, Any]
    data: dict[str, Any]
    extra: dict[str, Any]
    text: str
    size_bytes: int
    # `data` / `extra` rendered as JSON while sizing them, for writers that would render them
    # again (the sync COPY): one encoding per record instead of two.
    data_json: str | None = None
    extra_json: str | None = None
    # What redaction replaced, as [{"rule", "count"}] — never the values (memories.privacy.redaction;
    # docs/algorithms.md §11). Stored on the memory as `redaction_report`.
    redaction_report: list[dict[str, Any]] = field(default_factory=list)
    # A raw entry's canonical text as submitted, set by the write kernel (`prepare_memory`) only when
    # redaction changed it; never a column: the kernel seals it (memories.privacy.originals) when the school
    # opted in, and drops it otherwise.
    original_text: str | None = None

    def as_model_fields(self) -> dict[str, Any]:
        """Keyword arguments for `Memory(...)` / attribute assignment."""
        return {**self.columns, "data": self.data, "extra": self.extra, "text": self.text,
                "size_bytes": self.size_bytes, "redaction_report": self.redaction_report}


def memory_payload_view(memory: Memory) -> dict[str, Any]:
    """A stored memory as a client payload (columns + data + extra): the base for partial updates."""
    view: dict[str, Any] = dict(memory.extra or {})
    view.update(memory.data or {})
    for name in ("tags", "confidence", "source_type", "source_entity", "derived_from", "source_episodes",
                 "emotional_valence", "emotional_arousal", "emotional_tags", "subject_ids",
                 "access_grants", "consent_grants", "strength", "times_accessed", "is_protected"):
        view[name] = getattr(memory, name)
    for name in ("last_accessed", "expires_at"):
        value = getattr(memory, name)
        view[name] = value.isoformat() if value else None
    return view


def normalize_memory(kind: str, payload: Any, *, partial: bool = False,
                     existing: Memory | None = None, natural_key_optional: bool = False) -> NormalizedMemory:
    """Validate and normalise one memory record. See the module docstring for the contract.

    `natural_key_optional` (sync only): a drive without `drive_type`, a relationship without
    `entity_name` or a playbook without `name` is accepted with that field "" instead of refused
    (docs/kernle-protocol.md §3.9: stored, but never sent to a kernle device that cannot apply it).
    """
    if kind not in SCHEMAS:
        raise InvalidInput(f"Unknown memory kind {kind!r}.", fields={"kind": [f"Must be one of: {', '.join(KINDS)}."]})
    if not isinstance(payload, dict):
        raise InvalidInput("A memory must be a JSON object.", fields={"non_field_errors": ["Expected an object."]})
    if partial and existing is not None:
        merged = memory_payload_view(existing)
        merged.update(payload)
        payload = merged
    errors = FieldErrors()
    reader = Reader(payload, errors, natural_key_optional=natural_key_optional)
    columns = common_columns(reader, kind)
    data = SCHEMAS[kind](reader)
    for name in PASSTHROUGH:
        if name in payload and name not in reader.used:
            data[name] = reader.json_value(name)
    if errors.fields:
        raise InvalidInput("The memory is invalid.", fields=dict(errors.fields))

    extra = {k: v for k, v in payload.items() if k not in reader.used and k not in SERVER_CONTROLLED}
    try:
        extra = clean_json(extra)
    except InvalidUnicode:
        raise InvalidInput("The memory is invalid.", fields={"extra": [NOT_UNICODE]}) from None
    return assemble_memory(kind, columns, data, extra)


def assemble_memory(kind: str, columns: dict[str, Any], data: dict[str, Any],
                    extra: dict[str, Any]) -> NormalizedMemory:
    """Validated fields → a self-consistent NormalizedMemory: canonical text, JSON renderings, sizes
    and the size limits. Also how a transform (redaction) rebuilds a record it changed."""
    extra_json = json.dumps(extra, ensure_ascii=False)
    extra_bytes = len(extra_json.encode())
    if extra_bytes > EXTRA_MAX_BYTES:
        raise PayloadTooLarge(
            "Unknown fields take too much space.",
            fields={"extra": [f"Unknown fields are at most {EXTRA_MAX_BYTES} bytes (got {extra_bytes})."]},
        )
    text = canonical_text(kind, data, extra)
    data_json = json.dumps(data, ensure_ascii=False, default=str)
    # What the quota counts: the record as the client sent it — `data` and `extra` as JSON, plus the
    # tags. Not `text`, which is derived from `data` (counting it too counted content twice).
    size = len(data_json.encode()) + extra_bytes + sum(len(t.encode()) for t in columns["tags"])
    row_bytes = len(text.encode()) + size  # the stored row, derived text included: the per-record limit
    if row_bytes > MEMORY_MAX_BYTES:
        raise PayloadTooLarge(
            "The memory is too large.",
            fields={"non_field_errors": [f"A memory is at most {MEMORY_MAX_BYTES} bytes (got {row_bytes})."]},
        )
    return NormalizedMemory(kind=kind, columns=columns, data=data, extra=extra, text=text, size_bytes=size,
                            data_json=data_json, extra_json=extra_json)
