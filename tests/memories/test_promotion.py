"""Promotion: recurring lessons (>= 3 episodes, >= 2 occurrences, normalised) become beliefs with
provenance; suggest-only by default; idempotent."""

from __future__ import annotations

from typing import Any

import pytest

from memories.lifecycle.promotion import normalize_lesson, promote_lessons
from memories.models import Memory
from memories.services import memory_create, memory_forget
from tests.actors import School

pytestmark = pytest.mark.django_db



@pytest.fixture
def url(school: School) -> str:
    return school.stack_url("promote")


def _episode(stack: Any, record_id: str, lessons: list[str]) -> Memory:
    return memory_create(stack=stack, kind="episode", source="test", record_id=record_id,
                         payload={"objective": f"session {record_id}", "outcome": "ok", "lessons": lessons})


def test_normalize_lesson() -> None:
    assert normalize_lesson("  Test   First. ") == normalize_lesson("test first") == "test first"
    assert normalize_lesson("Draw it!?") == "draw it"


def test_needs_three_episodes(school: School) -> None:
    _episode(school.stack, "e1", ["Test first"])
    _episode(school.stack, "e2", ["Test first"])
    result = promote_lessons(stack=school.stack, auto=True)
    assert result.reason == "not_enough_episodes"
    assert result.created == 0
    assert not Memory.objects.filter(kind="belief").exists()


def test_suggest_then_auto_creates_beliefs_with_provenance(school: School, url: str) -> None:
    stack = school.stack
    _episode(stack, "e1", ["Test first", "Draw the pie"])
    _episode(stack, "e2", ["test  first.", "Once only"])
    _episode(stack, "e3", ["TEST FIRST", "Draw the pie!"])
    forgotten = _episode(stack, "e4", ["Forgotten lesson"])
    _episode(stack, "e5", ["Forgotten lesson"])
    memory_forget(memory=forgotten, reason="test")

    suggested = school.agent.post(url, {}, format="json")
    assert suggested.status_code == 200
    body = suggested.json()
    assert body["episodes_scanned"] == 4
    assert [(s["normalized"], s["occurrences"]) for s in body["suggestions"]] == [("test first", 3),
                                                                                    ("draw the pie", 2)]
    assert body["created"] == 0
    assert not Memory.objects.filter(kind="belief").exists()

    created = school.agent.post(url, {"auto": True}, format="json").json()
    assert created["created"] == 2
    belief = Memory.objects.get(kind="belief", data__statement="TEST FIRST")
    assert belief.data["belief_type"] == "pattern"
    assert belief.confidence == 0.7
    assert belief.source_type == "consolidation"
    assert belief.source_entity == "promotion"
    assert belief.derived_from == ["episode:e3", "episode:e2", "episode:e1"]
    assert belief.source_episodes == ["e3", "e2", "e1"]

    again = school.agent.post(url, {"auto": True}, format="json").json()
    assert again["created"] == 0
    assert again["skipped_existing"] == 2
    assert Memory.objects.filter(kind="belief").count() == 2


def test_invalid_promote_body(school: School, url: str) -> None:
    assert school.agent.post(url, {"limit": 0}, format="json").status_code == 400
    assert school.agent.post(url, {"auto": "perhaps"}, format="json").status_code == 400
