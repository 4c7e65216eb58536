"""MEMORY.md export: sections in order, filters (beliefs >= 0.4, active goals, no forgotten or
expired), one line per memory (no markdown injection), text/markdown."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from memories.services import CheckpointInput, boot_config_set, checkpoint_save, memory_create, memory_forget
from tests.actors import School

pytestmark = pytest.mark.django_db



@pytest.fixture
def url(school: School) -> str:
    return school.stack_url("export/memory.md")


def _create(stack: Any, kind: str, **payload: Any) -> Any:
    return memory_create(stack=stack, kind=kind, payload=payload, source="test")


def test_memory_md_sections_and_filters(school: School, url: str) -> None:
    stack = school.stack
    boot_config_set(stack=stack, key="student", value="Ada")
    _create(stack, "value", name="curiosity", statement="Ask why", priority=60)
    _create(stack, "value", name="honesty", statement="Say what you know", priority=90)
    _create(stack, "goal", title="Master fractions", description="by June", priority="high")
    _create(stack, "goal", title="Finished goal", status="done")
    _create(stack, "belief", statement="Pictures help", confidence=0.9)
    _create(stack, "belief", statement="Borderline belief", confidence=0.4)
    _create(stack, "belief", statement="Weak belief", confidence=0.39)
    forgotten = _create(stack, "belief", statement="Forgotten belief", confidence=0.9)
    memory_forget(memory=forgotten, reason="test")
    _create(stack, "belief", statement="Expired belief", confidence=0.9,
            expires_at=(timezone.now() - timedelta(minutes=1)).isoformat())
    _create(stack, "relationship", entity_name="Ms. Rivera", entity_type="person", relationship_type="teacher",
            interaction_count=5, notes="n" * 200)
    checkpoint_save(stack=stack, checkpoint=CheckpointInput(task="Fractions unit", next_step="decimals"))

    response = school.agent.get(url)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/markdown")
    md = response.content.decode()
    assert md.startswith("# MEMORY.md — Long-Term Memory\n")
    order = [md.index(h) for h in ("## Boot Config", "## Values", "## Goals", "## Beliefs", "## Key Relationships",
                                   "## Last Checkpoint")]
    assert order == sorted(order)
    assert md.index("**honesty** (priority 90)") < md.index("**curiosity** (priority 60)")
    assert "- [high] Master fractions — by June" in md
    assert "Finished goal" not in md
    assert "- [90%] Pictures help" in md
    assert "- [40%] Borderline belief" in md
    assert "Weak belief" not in md and "Forgotten belief" not in md and "Expired belief" not in md
    assert "n" * 77 + "..." in md and "n" * 81 not in md
    assert "- **Task**: Fractions unit" in md
    assert "- **Next step**: decimals" in md


def test_text_cannot_inject_markdown_structure(school: School, url: str) -> None:
    _create(school.stack, "belief", statement="fine\n# Injected heading\n- injected item", confidence=0.9)
    md = school.agent.get(url).content.decode()
    assert "\n# Injected" not in md
    assert "\n- injected" not in md
    assert "- [90%] fine # Injected heading - injected item" in md


def test_accept_markdown_header_and_empty_stack(school: School, url: str) -> None:
    response = school.agent.get(url, HTTP_ACCEPT="text/markdown")
    assert response.status_code == 200
    assert response.content.decode().startswith("# MEMORY.md")
    missing = school.agent.get("/api/v1/stacks/nope/export/memory.md", HTTP_ACCEPT="text/markdown")
    assert missing.status_code == 404
