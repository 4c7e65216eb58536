"""The nine per-kind schemas: what each kind of memory stores, and its canonical text.

A kind is its schema function (written with `memories.records.reader.Reader`), the common memory
block every kind shares (`common_columns`) and its canonical text (`canonical_text`,
docs/kernle-protocol.md §3.3), read together here. `memories.records.normalize` runs them for
every write; `memories.records.fields` records from them what each kind accepts.
"""

from __future__ import annotations

from typing import Any

from memories.records.reader import Reader
from memories.records.vocabulary import (
    GOAL_PRIORITY_LABELS,
    GOAL_STATUSES,
    LONG,
    MEDIUM,
    RAW_MAX,
    SHORT,
    SOURCE_TYPES,
)

# --- common fields ---------------------------------------------------------------------------------

# Memory-block fields kernle sends that we keep in `data` (known, loosely typed, returned on pull).
PASSTHROUGH = ("last_verified", "verification_count", "confidence_history", "context", "context_tags",
                "epoch_id", "processed", "source")


def common_columns(reader: Reader, kind: str) -> dict[str, Any]:
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

def _raw(r: Reader) -> dict[str, Any]:
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


def _episode(r: Reader) -> dict[str, Any]:
    return {
        "objective": r.string("objective", max_length=LONG, required=True),
        "outcome": r.string("outcome", max_length=LONG, required=True),
        "outcome_type": r.string("outcome_type", max_length=32, nullable=True),
        "lessons": r.string_list("lessons"),
        "repeat": r.string_list("repeat"),
        "avoid": r.string_list("avoid"),
        "processed": r.boolean("processed", default=False),
    }


def _note(r: Reader) -> dict[str, Any]:
    return {
        "content": r.string("content", max_length=LONG, required=True),
        "note_type": r.string("note_type", max_length=32, default="note") or "note",
        "speaker": r.string("speaker", max_length=SHORT, nullable=True),
        "reason": r.string("reason", max_length=MEDIUM, nullable=True),
        "processed": r.boolean("processed", default=False),
    }


def _belief(r: Reader) -> dict[str, Any]:
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


def _value(r: Reader) -> dict[str, Any]:
    return {
        "name": r.string("name", max_length=SHORT, required=True),
        "statement": r.string("statement", max_length=LONG, required=True),
        "priority": r.integer("priority", default=50, low=0, high=100),
    }


def _goal(r: Reader) -> dict[str, Any]:
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


def _drive(r: Reader) -> dict[str, Any]:
    return {
        "drive_type": r.string("drive_type", max_length=SHORT, required=not r.natural_key_optional),
        "intensity": r.number("intensity", default=0.5, low=0.0, high=1.0),
        "focus_areas": r.string_list("focus_areas", item_max=SHORT),
        "updated_at": r.json_value("updated_at"),
    }


# What a relationship that does not say is (docs/kernle-protocol.md §3.7): the kernle client's own
# defaults, which it applies to a pulled relationship too. Refusing the record instead would be a
# conflict its device re-sends unchanged, and the seed writes relationships without a type.
RELATIONSHIP_DEFAULTS = {"entity_type": "unknown", "relationship_type": "interaction"}


def _relationship(r: Reader) -> dict[str, Any]:
    # Missing, null or blank: the default.
    entity_type = r.string("entity_type", max_length=SHORT, default=RELATIONSHIP_DEFAULTS["entity_type"])
    relationship_type = r.string("relationship_type", max_length=SHORT,
                                 default=RELATIONSHIP_DEFAULTS["relationship_type"])
    return {
        "entity_name": r.string("entity_name", max_length=SHORT, required=not r.natural_key_optional),
        "entity_type": entity_type if entity_type.strip() else RELATIONSHIP_DEFAULTS["entity_type"],
        "relationship_type": (relationship_type if relationship_type.strip()
                              else RELATIONSHIP_DEFAULTS["relationship_type"]),
        "notes": r.string("notes", max_length=LONG, nullable=True),
        "sentiment": r.number("sentiment", default=0.0, low=-1.0, high=1.0),
        "interaction_count": r.integer("interaction_count", default=0, low=0, high=2**31 - 1),
        "last_interaction": r.json_value("last_interaction"),
    }


def _playbook(r: Reader) -> dict[str, Any]:
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


SCHEMAS = {
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


def goal_priority_rank(priority: Any) -> int:
    """A goal's priority as 0-100, whichever way the client spelled it."""
    if isinstance(priority, (int, float)) and not isinstance(priority, bool):
        return int(priority)
    if isinstance(priority, str):
        return GOAL_PRIORITY_LABELS.get(priority.lower(), 50)
    return 50
