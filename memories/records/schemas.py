"""Per-kind validation of memory payloads: THE schema every write goes through.

Why one module of ~600 lines: what a kind stores is its schema function, the reader helpers it
calls and its canonical text, read together; split apart, no file would say what a note is.

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
  (`native_record`, at the end of this module: a 400 `unknown_field`, fields of one's own under
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

Why a hand-written reader (`_Reader`) and not DRF serializers, which read every other input of
the API (memories.serializers): this runs once per record of every sync push, up to 1,000 per
request, and is already the largest per-operation cost of a push. Measured on the development
box for one kernle note: normalize_memory, text and sizes included, ~25 µs; a DRF serializer
checking the same fields alone, ~365 µs (instantiating one copies all its fields). The HTTP
endpoints that carry a record check their envelope with a serializer and the record here, so a
memory is validated by one schema whichever way it arrives.

One module over 400 lines on purpose: the reader, the common fields, the nine per-kind schemas and
the canonical text are one contract, read top to bottom.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.utils.dateparse import parse_datetime

from memoryhub.errors import InvalidInput, PayloadTooLarge

if TYPE_CHECKING:
    from memories.models import Memory

# Kinds are spelled here as plain strings so this module imports nothing from Django models.
KINDS = ("raw", "episode", "note", "belief", "value", "goal", "drive", "relationship", "playbook")

# Wire tables (docs/kernle-protocol.md §3.3) → kind.
KIND_FOR_TABLE = {
    "episodes": "episode", "notes": "note", "beliefs": "belief", "values": "value",
    "agent_values": "value", "goals": "goal", "drives": "drive", "relationships": "relationship",
    "playbooks": "playbook", "raw_captures": "raw", "raw_entries": "raw",
}

SHORT = 200          # names, types, labels
MEDIUM = 2_000       # titles, statements of identity
LONG = 20_000        # free text (objective, outcome, statement, content, description)
RAW_MAX = 100_000    # a raw capture
LIST_ITEMS = 500     # items in any list field: kernle unions lists up to 500 (MAX_SYNC_ARRAY_SIZE)
ITEM_MAX = 2_000     # one list item
EXTRA_MAX_BYTES = 64 * 1024
MEMORY_MAX_BYTES = 256 * 1024  # the whole stored record; larger is refused (413)

SOURCE_TYPES = frozenset({
    "direct_experience", "inference", "external", "consolidation", "processing", "seed",
    "observation", "imported", "unknown", "promotion", "api", "ingest", "",
})
GOAL_STATUSES = frozenset({
    "active", "done", "dropped", "completed", "paused", "abandoned", "achieved", "blocked",
    "cancelled", "pending", "in_progress", "archived",
})
GOAL_PRIORITY_LABELS = {"low": 25, "medium": 50, "high": 75, "urgent": 90, "critical": 100}

# Keys a client can never set; dropped, not kept in `extra` (docs/kernle-protocol.md §3.7).
SERVER_CONTROLLED = frozenset({
    "id", "stack_id", "agent_ref", "agent_id", "deleted", "version", "embedding", "synced_at",
    "server_updated_at", "cloud_synced_at", "is_forgotten", "forgotten_at", "forgotten_reason",
    "change_seq", "embedding_model", "embedded_version", "stability", "difficulty", "salience",
    "last_reviewed_at", "size_bytes", "kind", "record_id", "deleted_at", "search_vector", "text",
    "owner", "stack", "redaction_report",
})

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
# What `clean_text` must look at more closely: control characters or lone surrogates, in ONE search.
_UNCLEAN = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")

NOT_UNICODE = "Must be valid Unicode text (it contains a lone UTF-16 surrogate)."


class InvalidUnicode(InvalidInput):
    """A string holding a lone UTF-16 surrogate. JSON may spell one (`"\\ud800"`) and Python parses
    it, but it is not text: UTF-8, and so Postgres, cannot carry it. Refused, never altered — in a
    sync push it is that operation's conflict, never the whole request's (docs/kernle-protocol.md
    §3.2, §3.7)."""

    code = "invalid_unicode"

    def __init__(self) -> None:
        super().__init__("The request contains text that is not valid Unicode.")


def has_lone_surrogate(value: str) -> bool:
    return _SURROGATE.search(value) is not None


def clean_text(value: str) -> str:
    """Remove null bytes and control characters, keeping tab, newline and carriage return.

    Raises `InvalidUnicode` for a lone surrogate; callers that know the field report it there."""
    # Almost every string is already clean: a search is cheaper than building a substituted copy.
    if _UNCLEAN.search(value) is None:
        return value
    if _SURROGATE.search(value) is not None:
        raise InvalidUnicode()
    return _CONTROL.sub("", value)


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
    # What redaction replaced, as [{"rule", "count"}] — never the values (memories.redaction;
    # docs/algorithms.md §11). Stored on the memory as `redaction_report`.
    redaction_report: list[dict[str, Any]] = field(default_factory=list)
    # A raw entry's canonical text as submitted, set by the write kernel (`prepare_memory`) only when
    # redaction changed it; never a column: the kernel seals it (memories.originals) when the school
    # opted in, and drops it otherwise.
    original_text: str | None = None

    def as_model_fields(self) -> dict[str, Any]:
        """Keyword arguments for `Memory(...)` / attribute assignment."""
        return {**self.columns, "data": self.data, "extra": self.extra, "text": self.text,
                "size_bytes": self.size_bytes, "redaction_report": self.redaction_report}


class _Errors:
    def __init__(self) -> None:
        self.fields: dict[str, list[str]] = {}

    def add(self, name: str, message: str) -> None:
        self.fields.setdefault(name, []).append(message)


_MISSING = object()


@dataclass
class _Reader:
    """Reads typed fields from a payload, collecting field errors instead of stopping at the first."""

    payload: dict[str, Any]
    errors: _Errors
    used: set[str] = field(default_factory=set)
    # Sync stores drives / relationships / playbooks even without their natural key (see
    # normalize_memory's `natural_key_optional`).
    natural_key_optional: bool = False

    def _get(self, name: str) -> Any:
        self.used.add(name)
        return self.payload.get(name, _MISSING)

    def string(self, name: str, *, max_length: int, default: str | None = "", required: bool = False,
               choices: frozenset[str] | None = None, nullable: bool = False) -> Any:
        value = self._get(name)
        if value is _MISSING or value is None:
            if required:
                self.errors.add(name, "This field is required.")
                return default
            return None if nullable else default
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            self.errors.add(name, "Must be a string.")
            return default
        try:
            text = clean_text(value if type(value) is str else str(value))
        except InvalidUnicode:
            self.errors.add(name, NOT_UNICODE)
            return default
        if required and not text.strip():
            self.errors.add(name, "This field may not be blank.")
            return default
        if len(text) > max_length:
            self.errors.add(name, f"At most {max_length} characters (got {len(text)}).")
            return default
        if choices is not None and text not in choices:
            self.errors.add(name, f"Must be one of: {', '.join(sorted(c for c in choices if c))}.")
            return default
        return text

    def number(self, name: str, *, default: float | None, low: float, high: float) -> Any:
        value = self._get(name)
        if value is _MISSING or value is None:
            return default
        number = _as_number(value)
        if number is None:
            self.errors.add(name, "Must be a number.")
            return default
        if not low <= number <= high:
            self.errors.add(name, f"Must be between {low:g} and {high:g}.")
            return default
        return number

    def integer(self, name: str, *, default: int | None, low: int, high: int) -> Any:
        value = self._get(name)
        if value is _MISSING or value is None:
            return default
        number = _as_number(value)
        if number is None or number != int(number):
            self.errors.add(name, "Must be an integer.")
            return default
        if not low <= number <= high:
            self.errors.add(name, f"Must be between {low} and {high}.")
            return default
        return int(number)

    def boolean(self, name: str, *, default: bool | None) -> Any:
        value = self._get(name)
        if value is _MISSING or value is None:
            return default
        if isinstance(value, bool):
            return value
        if value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        self.errors.add(name, "Must be true or false.")
        return default

    def string_list(self, name: str, *, max_items: int = LIST_ITEMS, item_max: int = ITEM_MAX,
                    required: bool = False) -> list[str]:
        value = self._get(name)
        if value is _MISSING or value is None:
            if required:
                self.errors.add(name, "This field is required.")
            return []
        if isinstance(value, str):  # a lone string is a one-item list, not a list of characters
            value = [value]
        if not isinstance(value, (list, tuple)):
            self.errors.add(name, "Must be a list of strings.")
            return []
        if len(value) > max_items:
            self.errors.add(name, f"At most {max_items} items (got {len(value)}).")
            return []
        result: list[str] = []
        for item in value:
            if item is None:
                continue
            if isinstance(item, bool) or not isinstance(item, (str, int, float)):
                self.errors.add(name, "Every item must be a string.")
                return []
            try:
                text = clean_text(item if type(item) is str else str(item))
            except InvalidUnicode:
                self.errors.add(name, NOT_UNICODE)
                return []
            if len(text) > item_max:
                self.errors.add(name, f"Items are at most {item_max} characters.")
                return []
            result.append(text)
        return result

    def dict_list(self, name: str, *, required: bool = False) -> list[Any]:
        """A list of steps: dicts (kernle) or plain strings; nested strings are cleaned."""
        value = self._get(name)
        if value is _MISSING or value is None:
            if required:
                self.errors.add(name, "This field is required.")
            return []
        if not isinstance(value, (list, tuple)):
            self.errors.add(name, "Must be a list.")
            return []
        if len(value) > LIST_ITEMS:
            self.errors.add(name, f"At most {LIST_ITEMS} items (got {len(value)}).")
            return []
        result: list[Any] = []
        for item in value:
            if not isinstance(item, (dict, str)):
                self.errors.add(name, "Every item must be an object or a string.")
                return []
            try:
                result.append(clean_json(item))
            except InvalidUnicode:
                self.errors.add(name, NOT_UNICODE)
                return []
        return result

    def timestamp(self, name: str) -> datetime | None:
        value = self._get(name)
        if value is _MISSING or value is None or value == "":
            return None
        parsed = parse_timestamp(value)
        if parsed is None:
            self.errors.add(name, "Must be an ISO-8601 date-time.")
        return parsed

    def json_value(self, name: str) -> Any:
        value = self._get(name)
        if value is _MISSING:
            return None
        try:
            return clean_json(value)
        except InvalidUnicode:
            self.errors.add(name, NOT_UNICODE)
            return None

    def goal_priority(self, name: str) -> Any:
        """kernle sends a goal's priority as a label ("medium"), other clients 0-100: keep what was sent."""
        raw = self.payload.get(name)
        if isinstance(raw, str) and not raw.strip().lstrip("-").replace(".", "", 1).isdigit():
            label = self.string(name, max_length=32, default="medium")
            if label and label.lower() not in GOAL_PRIORITY_LABELS:
                self.errors.add(name, f"Must be 0-100 or one of: {', '.join(GOAL_PRIORITY_LABELS)}.")
            return (label or "medium").lower()
        if raw is not None:
            return self.integer(name, default=50, low=0, high=100)
        self.used.add(name)
        return "medium"

    def require_one_of(self, what: str, values: dict[str, Any]) -> None:
        """At least one of these (already read) fields must be non-blank; the error names the first."""
        if any(name in self.errors.fields for name in values):
            return
        if not any(isinstance(value, str) and value.strip() for value in values.values()):
            self.errors.add(next(iter(values)), f"{what} needs `{'` or `'.join(values)}`.")


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None


def parse_timestamp(value: Any) -> datetime | None:
    """ISO-8601 → aware datetime; a naive value counts as UTC (docs/kernle-protocol.md §3.7)."""
    if isinstance(value, datetime):
        parsed: datetime | None = value
    elif isinstance(value, str):
        try:
            parsed = parse_datetime(value.strip().replace("Z", "+00:00"))
        except ValueError:
            return None
    else:
        return None
    if parsed is None:
        return None
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    # In UTC: Python takes offsets up to ±23:59, PostgreSQL only up to ±15:59 (a DataError there, not
    # a field error). The instant is kept; one that leaves Python's years 1-9999 in UTC is invalid.
    try:
        return parsed.astimezone(UTC)
    except (OverflowError, ValueError):
        return None


def clean_json(value: Any, depth: int = 0) -> Any:
    """Remove null bytes / control characters from every string (and key) of a JSON value."""
    if depth > 20:
        raise InvalidInput("The record is nested too deeply.", fields={"extra": ["Nested too deeply."]})
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(str(k)): clean_json(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v, depth + 1) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return clean_text(str(value))


# --- common fields ---------------------------------------------------------------------------------

# Memory-block fields kernle sends that we keep in `data` (known, loosely typed, returned on pull).
_PASSTHROUGH = ("last_verified", "verification_count", "confidence_history", "context", "context_tags",
                "epoch_id", "processed", "source")


def _common(reader: _Reader, kind: str) -> dict[str, Any]:
    protected_default = kind in ("value", "drive")
    confidence_default = 0.9 if kind == "value" else 0.8
    columns: dict[str, Any] = {
        "tags": reader.string_list("tags", item_max=SHORT),
        "confidence": reader.number("confidence", default=confidence_default, low=0.0, high=1.0),
        "source_type": reader.string("source_type", max_length=32, choices=SOURCE_TYPES),
        "source_entity": reader.string("source_entity", max_length=SHORT),
        "derived_from": reader.string_list("derived_from", item_max=SHORT),
        "source_episodes": reader.string_list("source_episodes", item_max=SHORT),
        "emotional_valence": reader.number("emotional_valence", default=0.0, low=-1.0, high=1.0),
        "emotional_arousal": reader.number("emotional_arousal", default=0.0, low=0.0, high=1.0),
        "emotional_tags": reader.string_list("emotional_tags", item_max=SHORT),
        "subject_ids": reader.string_list("subject_ids", item_max=SHORT),
        "access_grants": reader.string_list("access_grants", item_max=SHORT),
        "consent_grants": reader.string_list("consent_grants", item_max=SHORT),
        "strength": reader.number("strength", default=1.0, low=0.0, high=1.0),
        "times_accessed": reader.integer("times_accessed", default=0, low=0, high=2**31 - 1),
        "last_accessed": reader.timestamp("last_accessed"),
        "is_protected": reader.boolean("is_protected", default=protected_default),
        "expires_at": reader.timestamp("expires_at"),
    }
    created_at = reader.timestamp("created_at")
    if created_at is not None:
        columns["created_at"] = created_at
    client_updated_at = reader.timestamp("local_updated_at")
    if client_updated_at is not None:
        columns["client_updated_at"] = client_updated_at
    return columns


# --- per-kind schemas ------------------------------------------------------------------------------

def _raw(r: _Reader) -> dict[str, Any]:
    data = {
        "blob": r.string("blob", max_length=RAW_MAX, nullable=True),
        "content": r.string("content", max_length=RAW_MAX, nullable=True),
        "source": r.string("source", max_length=SHORT, nullable=True),
        "captured_at": r.json_value("captured_at"),
        "timestamp": r.json_value("timestamp"),
        "processed": r.boolean("processed", default=False),
        "processed_into": r.json_value("processed_into"),
    }
    r.require_one_of("A raw entry", {"content": data["content"], "blob": data["blob"]})
    return data


def _episode(r: _Reader) -> dict[str, Any]:
    return {
        "objective": r.string("objective", max_length=LONG, required=True),
        "outcome": r.string("outcome", max_length=LONG, required=True),
        "outcome_type": r.string("outcome_type", max_length=32, nullable=True),
        "lessons": r.string_list("lessons"),
        "repeat": r.string_list("repeat"),
        "avoid": r.string_list("avoid"),
        "processed": r.boolean("processed", default=False),
    }


def _note(r: _Reader) -> dict[str, Any]:
    return {
        "content": r.string("content", max_length=LONG, required=True),
        "note_type": r.string("note_type", max_length=32, default="note") or "note",
        "speaker": r.string("speaker", max_length=SHORT, nullable=True),
        "reason": r.string("reason", max_length=MEDIUM, nullable=True),
        "processed": r.boolean("processed", default=False),
    }


def _belief(r: _Reader) -> dict[str, Any]:
    return {
        "statement": r.string("statement", max_length=LONG, required=True),
        "belief_type": r.string("belief_type", max_length=32, default="fact") or "fact",
        "supersedes": r.string("supersedes", max_length=SHORT, nullable=True),
        "superseded_by": r.string("superseded_by", max_length=SHORT, nullable=True),
        "times_reinforced": r.integer("times_reinforced", default=0, low=0, high=2**31 - 1),
        "is_active": r.boolean("is_active", default=True),
        "processed": r.boolean("processed", default=False),
        "belief_scope": r.string("belief_scope", max_length=32, default="world") or "world",
        "source_domain": r.string("source_domain", max_length=SHORT, nullable=True),
        "cross_domain_applications": r.string_list("cross_domain_applications", item_max=SHORT),
        "abstraction_level": r.string("abstraction_level", max_length=32, default="specific") or "specific",
    }


def _value(r: _Reader) -> dict[str, Any]:
    return {
        "name": r.string("name", max_length=SHORT, required=True),
        "statement": r.string("statement", max_length=LONG, required=True),
        "priority": r.integer("priority", default=50, low=0, high=100),
    }


def _goal(r: _Reader) -> dict[str, Any]:
    priority = r.goal_priority("priority")
    status = r.string("status", max_length=32, default="active") or "active"
    if status.lower() not in GOAL_STATUSES:
        r.errors.add("status", f"Must be one of: {', '.join(sorted(GOAL_STATUSES))}.")
    return {
        "title": r.string("title", max_length=MEDIUM, required=True),
        "description": r.string("description", max_length=LONG, nullable=True),
        "goal_type": r.string("goal_type", max_length=32, default="task") or "task",
        "priority": priority,
        "status": status.lower(),
    }


def _drive(r: _Reader) -> dict[str, Any]:
    return {
        "drive_type": r.string("drive_type", max_length=SHORT, required=not r.natural_key_optional),
        "intensity": r.number("intensity", default=0.5, low=0.0, high=1.0),
        "focus_areas": r.string_list("focus_areas", item_max=SHORT),
        "updated_at": r.json_value("updated_at"),
    }


def _relationship(r: _Reader) -> dict[str, Any]:
    return {
        "entity_name": r.string("entity_name", max_length=SHORT, required=not r.natural_key_optional),
        "entity_type": r.string("entity_type", max_length=SHORT, required=True),
        "relationship_type": r.string("relationship_type", max_length=SHORT, required=True),
        "notes": r.string("notes", max_length=LONG, nullable=True),
        "sentiment": r.number("sentiment", default=0.0, low=-1.0, high=1.0),
        "interaction_count": r.integer("interaction_count", default=0, low=0, high=2**31 - 1),
        "last_interaction": r.json_value("last_interaction"),
    }


def _playbook(r: _Reader) -> dict[str, Any]:
    return {
        "name": r.string("name", max_length=SHORT, required=not r.natural_key_optional),
        "description": r.string("description", max_length=LONG, required=True),
        "trigger_conditions": r.string_list("trigger_conditions"),
        "steps": r.dict_list("steps"),
        "failure_modes": r.string_list("failure_modes"),
        "recovery_steps": r.string_list("recovery_steps"),
        "mastery_level": r.string("mastery_level", max_length=32, default="novice") or "novice",
        "times_used": r.integer("times_used", default=0, low=0, high=2**31 - 1),
        "success_rate": r.number("success_rate", default=0.0, low=0.0, high=1.0),
        "last_used": r.json_value("last_used"),
    }


_SCHEMAS = {
    "raw": _raw, "episode": _episode, "note": _note, "belief": _belief, "value": _value,
    "goal": _goal, "drive": _drive, "relationship": _relationship, "playbook": _playbook,
}


# --- canonical text (docs/kernle-protocol.md §3.3) ----------------------------------------

def _step_text(step: Any) -> str:
    if isinstance(step, str):
        return step
    if isinstance(step, dict):
        return " ".join(str(v) for v in step.values() if isinstance(v, (str, int, float)) and not isinstance(v, bool))
    return ""


def canonical_text(kind: str, data: dict[str, Any], extra: dict[str, Any]) -> str:
    """The text we embed and index for a record: the kind's content fields, joined by newlines."""

    def legacy(*names: str) -> list[str]:
        return [extra[n] for n in names if isinstance(extra.get(n), str)]

    parts: list[str]
    if kind == "episode":
        parts = [data["objective"], data["outcome"], *data["lessons"], *legacy("lesson", "summary")]
    elif kind == "note":
        parts = [data["content"], *legacy("text")]
    elif kind == "belief":
        parts = [data["statement"]]
    elif kind == "value":
        parts = [data["name"], data["statement"]]
    elif kind == "goal":
        parts = [data["title"], data.get("description") or ""]
    elif kind == "drive":
        parts = [data["drive_type"], *data["focus_areas"], *legacy("description")]
    elif kind == "relationship":
        parts = [data["entity_name"], data.get("notes") or "", *legacy("description")]
    elif kind == "playbook":
        parts = [data["name"], data["description"], *(_step_text(s) for s in data["steps"])]
    else:  # raw
        parts = [data.get("blob") or data.get("content") or "", *legacy("text")]
    return "\n".join(p.strip() for p in parts if p and p.strip())


# --- entry point -----------------------------------------------------------------------------------

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
    if kind not in _SCHEMAS:
        raise InvalidInput(f"Unknown memory kind {kind!r}.", fields={"kind": [f"Must be one of: {', '.join(KINDS)}."]})
    if not isinstance(payload, dict):
        raise InvalidInput("A memory must be a JSON object.", fields={"non_field_errors": ["Expected an object."]})
    if partial and existing is not None:
        merged = memory_payload_view(existing)
        merged.update(payload)
        payload = merged
    errors = _Errors()
    reader = _Reader(payload, errors, natural_key_optional=natural_key_optional)
    columns = _common(reader, kind)
    data = _SCHEMAS[kind](reader)
    for name in _PASSTHROUGH:
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


def goal_priority_rank(priority: Any) -> int:
    """A goal's priority as 0-100, whichever way the client spelled it."""
    if isinstance(priority, (int, float)) and not isinstance(priority, bool):
        return int(priority)
    if isinstance(priority, str):
        return GOAL_PRIORITY_LABELS.get(priority.lower(), 50)
    return 50


# --- what each kind accepts: the native API's strictness and the OpenAPI document ------------------
#
# The field list of a kind is not written down a second time: `_Recorder` runs the kind's schema
# function (and the common fields) on an empty payload and writes down every field it reads, with
# its type and limits. The native API refuses keys outside that list (`native_record`) and its
# OpenAPI document describes exactly that list (memories.serializers), so neither can drift from the
# validation above. Kernle sync never asks: it keeps unknown fields in `extra`
# (docs/kernle-protocol.md §3.7).

EXTRA_FIELD = "extra"  # the native API's explicit home for fields a kind does not model
UNKNOWN_FIELD = "unknown_field"
# Where a client that sends `text` (derived by the server) most likely meant to write.
_MAIN_FIELD = {"raw": "content", "episode": "objective", "note": "content", "belief": "statement",
               "value": "statement", "goal": "title", "drive": "drive_type", "relationship": "entity_name",
               "playbook": "description"}


@dataclass(frozen=True)
class FieldSpec:
    """One field a kind's schema reads, as the schema declares it."""

    name: str
    # string | number | integer | boolean | string_list | object_list | timestamp | any | goal_priority
    type: str
    required: bool = False
    max_length: int | None = None
    choices: tuple[str, ...] = ()
    low: float | None = None
    high: float | None = None
    default: Any = None
    max_items: int | None = None


@dataclass(frozen=True)
class KindFields:
    kind: str
    fields: tuple[FieldSpec, ...]
    # Groups of which at least one field must be non-blank (a raw entry: content or blob).
    one_of_required: tuple[tuple[str, ...], ...]

    @property
    def names(self) -> frozenset[str]:
        return frozenset(spec.name for spec in self.fields)


class _Recorder(_Reader):
    """A reader that reads nothing: each call writes down the field it was asked for."""

    def __init__(self) -> None:
        super().__init__(payload={}, errors=_Errors())
        self.specs: dict[str, FieldSpec] = {}
        self.groups: list[tuple[str, ...]] = []

    def _record(self, spec: FieldSpec) -> None:
        self.used.add(spec.name)
        self.specs.setdefault(spec.name, spec)

    def string(self, name: str, *, max_length: int, default: str | None = "", required: bool = False,
               choices: frozenset[str] | None = None, nullable: bool = False) -> Any:
        self._record(FieldSpec(name, "string", required=required, max_length=max_length,
                               choices=tuple(sorted(choices or ())), default=None if nullable else default or None))
        return default

    def number(self, name: str, *, default: float | None, low: float, high: float) -> Any:
        self._record(FieldSpec(name, "number", low=low, high=high, default=default))
        return default

    def integer(self, name: str, *, default: int | None, low: int, high: int) -> Any:
        self._record(FieldSpec(name, "integer", low=low, high=high, default=default))
        return default

    def boolean(self, name: str, *, default: bool | None) -> Any:
        self._record(FieldSpec(name, "boolean", default=default))
        return default

    def string_list(self, name: str, *, max_items: int = LIST_ITEMS, item_max: int = ITEM_MAX,
                    required: bool = False) -> list[str]:
        self._record(FieldSpec(name, "string_list", required=required, max_length=item_max, max_items=max_items))
        return []

    def dict_list(self, name: str, *, required: bool = False) -> list[Any]:
        self._record(FieldSpec(name, "object_list", required=required, max_items=LIST_ITEMS))
        return []

    def timestamp(self, name: str) -> datetime | None:
        self._record(FieldSpec(name, "timestamp"))
        return None

    def json_value(self, name: str) -> Any:
        self._record(FieldSpec(name, "any"))
        return None

    def goal_priority(self, name: str) -> Any:
        self._record(FieldSpec(name, "goal_priority", choices=tuple(GOAL_PRIORITY_LABELS), low=0, high=100,
                               default="medium"))
        return "medium"

    def require_one_of(self, what: str, values: dict[str, Any]) -> None:
        self.groups.append(tuple(values))


_KIND_FIELDS: dict[str, KindFields] = {}


def kind_fields(kind: str) -> KindFields:
    """The fields a `kind` record may carry: its own, then the common ones, then the passthrough."""
    if kind not in _KIND_FIELDS:
        recorder = _Recorder()
        _SCHEMAS[kind](recorder)
        _common(recorder, kind)
        for name in _PASSTHROUGH:
            recorder.json_value(name)
        _KIND_FIELDS[kind] = KindFields(kind, tuple(recorder.specs.values()), tuple(recorder.groups))
    return _KIND_FIELDS[kind]


def _unknown_field_message(kind: str, name: str, known: list[str]) -> str:
    if name in SERVER_CONTROLLED:
        hint = {"id": " Use `record_id` for your own id.",
                "text": f" Did you mean '{_MAIN_FIELD.get(kind, 'content')}'?"}.get(name, "")
        return "Set by the server; it cannot be written." + hint
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.75)
    if close:
        # Two letters swapped ("contnet") scores no better against `content` than against `context`:
        # a candidate made of the same letters wins.
        best = next((candidate for candidate in close if sorted(candidate) == sorted(name)), close[0])
        return f"Unknown field. Did you mean '{best}'?"
    return f"Unknown field for a {kind}; fields a kind does not model go under `{EXTRA_FIELD}`."


def native_record(kind: str, record: dict[str, Any], *, prefix: str = "") -> dict[str, Any]:
    """The native API's reading of a record: every key must be a field of `kind`, or `extra`.

    Unknown keys (typos above all) and server-controlled ones are a 400 `unknown_field` naming each
    key (prefixed with `prefix`, e.g. "items.3.") and suggesting the closest known field. `extra`,
    an object, holds fields the kind does not model; it is unpacked here into the record so that
    `normalize_memory` keeps them in `extra` exactly as it does for sync. A `kind` that is not a
    memory kind is left to `normalize_memory`, which names it.
    """
    if kind not in _SCHEMAS:
        return record
    known = kind_fields(kind).names
    errors: dict[str, list[str]] = {}
    suggestions = sorted(known | {EXTRA_FIELD})
    for name in record:
        if name not in known and name != EXTRA_FIELD:
            errors[prefix + str(name)] = [_unknown_field_message(kind, str(name), suggestions)]
    extra = record.get(EXTRA_FIELD)
    if extra is not None and not isinstance(extra, dict):
        errors[prefix + EXTRA_FIELD] = ["Must be an object."]
    elif extra:
        for name in extra:
            if name in known or name in SERVER_CONTROLLED or name == EXTRA_FIELD:
                errors[f"{prefix}{EXTRA_FIELD}.{name}"] = [
                    f"A field of a {kind}; send it at the top level." if name in known
                    else "A reserved name; it cannot be kept in extra."]
    if errors:
        raise InvalidInput("The memory has fields its kind does not know.", code=UNKNOWN_FIELD, fields=errors)
    if EXTRA_FIELD not in record:
        return record
    flat = {name: value for name, value in record.items() if name != EXTRA_FIELD}
    flat.update(extra or {})
    return flat
