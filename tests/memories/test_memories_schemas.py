"""memories.records.normalize.normalize_memory: kernle-shaped records (nulls included) are accepted, typed and
split into columns / data / extra; bad values name their field."""

from __future__ import annotations

from typing import Any

import pytest

from memories.records.normalize import normalize_memory
from memories.records.vocabulary import KIND_FOR_TABLE
from memoryhub.errors import InvalidInput

SYNC_BLOCK = {"id": "f3d5897b", "stack_id": "acceptance", "created_at": "2026-11-21T23:15:33.202096+00:00",
              "local_updated_at": "2026-11-21T23:15:33.202096", "cloud_synced_at": None, "version": 1,
              "deleted": False}
MEMORY_BLOCK = {"confidence": 0.8, "source_type": "direct_experience", "source_entity": None, "source_episodes": None,
                "derived_from": ["raw:dc65"], "last_verified": None, "verification_count": 0,
                "confidence_history": None, "strength": 1.0, "times_accessed": 0, "last_accessed": None,
                "is_protected": False, "context": None, "context_tags": None, "epoch_id": None,
                "subject_ids": None, "access_grants": None, "consent_grants": None}

KERNLE_RECORDS: dict[str, dict[str, Any]] = {
    "episodes": {"objective": "Deployed v2", "outcome": "success", "outcome_type": "success",
                 "lessons": ["Run migrations first"], "repeat": None, "avoid": None, "tags": ["deploy"],
                 "emotional_valence": 0.0, "emotional_arousal": 0.0, "emotional_tags": None, "processed": False},
    "notes": {"content": "Prefers visuals", "note_type": "note", "speaker": None, "reason": None, "tags": None,
              "processed": False},
    "beliefs": {"statement": "Pictures help", "belief_type": "fact", "supersedes": None, "superseded_by": None,
                "times_reinforced": 0, "is_active": True, "processed": False, "belief_scope": "world",
                "source_domain": None, "cross_domain_applications": None, "abstraction_level": "specific"},
    "agent_values": {"name": "curiosity", "statement": "Ask why", "priority": 50},
    "goals": {"title": "Ship", "description": None, "goal_type": "task", "priority": "medium", "status": "active"},
    "drives": {"drive_type": "growth", "intensity": 0.5, "focus_areas": None, "updated_at": None},
    "relationships": {"entity_name": "Ms. Rivera", "entity_type": "person", "relationship_type": "teacher",
                      "notes": None, "sentiment": 0.0, "interaction_count": 0, "last_interaction": None},
    "raw_captures": {"blob": "captured text", "captured_at": "2026-11-21T23:15:33+00:00", "source": "cli",
                     "processed": False},
}


@pytest.mark.parametrize("table", list(KERNLE_RECORDS))
def test_kernle_records_with_nulls_are_accepted(table: str) -> None:
    payload = {**SYNC_BLOCK, **MEMORY_BLOCK, **KERNLE_RECORDS[table], "future_field": {"x": 1}}
    kind = KIND_FOR_TABLE[table]
    result = normalize_memory(kind, payload)
    assert result.extra == {"future_field": {"x": 1}}  # server-controlled keys dropped, unknown kept
    assert result.columns["client_updated_at"].tzinfo is not None  # naive timestamps count as UTC
    assert result.columns["created_at"].isoformat() == "2026-11-21T23:15:33.202096+00:00"
    assert result.columns["derived_from"] == ["raw:dc65"]
    assert result.columns["subject_ids"] == []
    assert result.text
    assert result.size_bytes > len(result.text)


def test_playbook_record() -> None:
    payload = {**SYNC_BLOCK, "name": "Warm-up", "description": "Start", "trigger_conditions": ["new"],
               "steps": [{"action": "draw", "detail": "a pie"}], "failure_modes": [], "recovery_steps": None,
               "mastery_level": "novice", "times_used": 0, "success_rate": 0.0, "source_episodes": None,
               "tags": None, "confidence": 0.8, "last_used": None, "context": None, "context_tags": None}
    result = normalize_memory("playbook", payload)
    assert result.text == "Warm-up\nStart\ndraw a pie"
    assert result.columns["is_protected"] is False


def test_defaults_per_kind() -> None:
    value = normalize_memory("value", {"name": "n", "statement": "s"})
    assert value.columns["is_protected"] is True and value.columns["confidence"] == 0.9
    assert value.data["priority"] == 50
    drive = normalize_memory("drive", {"drive_type": "growth"})
    assert drive.columns["is_protected"] is True and drive.data["intensity"] == 0.5
    goal = normalize_memory("goal", {"title": "t", "priority": 70, "status": "Completed"})
    assert goal.data["priority"] == 70 and goal.data["status"] == "completed"
    assert normalize_memory("belief", {"statement": "s", "is_protected": False}).columns["is_protected"] is False


def test_errors_collect_every_field() -> None:
    with pytest.raises(InvalidInput) as caught:
        normalize_memory("relationship", {"entity_name": "", "sentiment": "x", "interaction_count": -1})
    assert set(caught.value.fields) == {"entity_name", "sentiment", "interaction_count"}


@pytest.mark.parametrize("given", [{}, {"entity_type": None, "relationship_type": None},
                                   {"entity_type": " ", "relationship_type": ""}])
def test_a_relationship_without_its_types_gets_the_documented_defaults(given: dict[str, Any]) -> None:
    """docs/kernle-protocol.md §3.7: the kernle client's own defaults, not a conflict it re-sends forever."""
    relationship = normalize_memory("relationship", {"entity_name": "Ms. Rivera", **given})
    assert relationship.data["entity_type"] == "unknown" and relationship.data["relationship_type"] == "interaction"
    said = normalize_memory("relationship", {"entity_name": "Ms. Rivera", "entity_type": "person",
                                             "relationship_type": "teacher"})
    assert (said.data["entity_type"], said.data["relationship_type"]) == ("person", "teacher")


@pytest.mark.parametrize("payload", [None, [], "text", 3])
def test_non_objects_refused(payload: Any) -> None:
    with pytest.raises(InvalidInput):
        normalize_memory("note", payload)


def test_unknown_kind_refused() -> None:
    with pytest.raises(InvalidInput) as caught:
        normalize_memory("dream", {})
    assert "kind" in caught.value.fields


def test_nan_and_infinity_refused() -> None:
    for bad in (float("nan"), float("inf"), "NaN"):
        with pytest.raises(InvalidInput):
            normalize_memory("belief", {"statement": "s", "confidence": bad})
