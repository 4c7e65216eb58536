"""Smart ingest (prediction-error gating, docs/algorithms.md §6) and retrieval feedback (§3)."""

from __future__ import annotations

from typing import Any

import pytest

from accounts.models import Membership
from memories.models import Memory, MemoryRevision
from memories.search.smart_ingest import appears_contradictory
from tests.actors import School
from tests.factories import assign_teacher, bearer_client, make_key, make_user
from tests.memories.test_search import session_client

pytestmark = pytest.mark.django_db

BASE = "Alice learns fractions best when the teacher uses pizza slices and paper strips in class"


def ingest(school: School, content: str, kind: str = "note", **extra: Any) -> Any:
    field = {"note": "content", "belief": "statement"}[kind]
    return school.agent.post("/api/v1/stacks/alice/ingest",
                             {"kind": kind, field: content, **extra}, format="json")


def test_first_memory_is_created_with_full_prediction_error(school: School) -> None:
    response = ingest(school, BASE)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["decision"] == "create"
    assert body["prediction_error"] == 1.0
    assert body["target_id"] is None
    assert body["reason"]
    memory = Memory.objects.get(pk=body["memory"]["id"])
    assert memory.text == BASE
    # Smart ingest stores the vector it computed, so the next ingest sees this memory at once.
    assert memory.embedded_version == memory.version


def test_near_identical_reinforces_without_changing_content(school: School) -> None:
    first = ingest(school, BASE).json()["memory"]["id"]
    before = Memory.objects.get(pk=first)
    body = ingest(school, BASE).json()
    assert body["decision"] == "reinforce"
    assert body["target_id"] == first
    assert body["similarity"] == pytest.approx(1.0)
    assert body["measure"] == "cosine:hash-v1/384"
    after = Memory.objects.get(pk=first)
    assert Memory.objects.filter(stack=school.stack).count() == 1
    assert (after.text, after.version) == (before.text, before.version)
    assert after.last_reviewed_at is not None
    revision = MemoryRevision.objects.get(memory_id=first, action="reinforce")
    assert revision.source == "ingest"


def test_contradiction_is_never_reinforced_or_merged_but_linked(school: School) -> None:
    first = ingest(school, "Always use the calculator for fractions homework").json()["memory"]["id"]
    body = ingest(school, "Never use the calculator for fractions homework").json()
    assert body["decision"] == "create"
    assert body["contradiction"] is True
    assert body["target_id"] == first
    assert body["similarity"] >= 0.70
    old = Memory.objects.get(pk=first)
    assert old.text == "Always use the calculator for fractions homework"
    assert old.version == 1
    assert old.last_reviewed_at is None  # not reinforced
    link = MemoryRevision.objects.get(memory_id=first, action="contradicted")
    assert link.snapshot["linked_memory"] == body["memory"]["id"]


def test_update_band_merges_and_keeps_the_merge_inspectable(school: School) -> None:
    first = ingest(school, BASE).json()["memory"]["id"]
    incoming = BASE + " on Mondays"
    body = ingest(school, incoming, thresholds={"near_identical": 0.99, "update": 0.5}).json()
    assert body["decision"] == "update", body
    assert body["target_id"] == first == body["memory"]["id"]
    merged = Memory.objects.get(pk=first)
    assert merged.text.startswith(BASE + "\n\n[Updated ")
    assert merged.text.endswith(incoming)
    assert merged.version == 2
    revision = MemoryRevision.objects.get(memory_id=first, action="merge")
    assert revision.snapshot["before_text"] == BASE
    assert revision.snapshot["incoming_text"] == incoming
    assert revision.snapshot["after_text"] == merged.text
    assert "+" + incoming in revision.snapshot["diff"]
    # The full before-state is kept too (reversible).
    assert MemoryRevision.objects.get(memory_id=first, action="update").snapshot["text"] == BASE


def test_no_merge_into_strong_or_demoted_memories(school: School) -> None:
    first = ingest(school, BASE).json()["memory"]["id"]
    promote = school.agent.post(f"/api/v1/stacks/alice/memories/{first}/feedback", {"action": "promote"},
                                format="json")
    assert promote.status_code == 200
    body = ingest(school, BASE + " on Mondays", thresholds={"near_identical": 0.99, "update": 0.5}).json()
    assert body["decision"] == "create"
    assert "strong" in body["reason"]
    assert Memory.objects.get(pk=first).text == BASE

    second = ingest(school, "Bob finds long division hard without squared paper", "belief").json()["memory"]["id"]
    school.agent.post(f"/api/v1/stacks/alice/memories/{second}/feedback", {"action": "demote"}, format="json")
    body = ingest(school, "Bob finds long division hard without squared paper at home", "belief",
                  thresholds={"near_identical": 0.99, "update": 0.5}).json()
    assert body["decision"] == "create"
    assert "demoted" in body["reason"]
    demoted = Memory.objects.get(pk=second)
    assert demoted.forgotten_at is None and demoted.version == 1


def test_force_create_and_explicit_supersede(school: School) -> None:
    first = ingest(school, BASE).json()["memory"]["id"]
    forced = ingest(school, BASE, force_create=True).json()
    assert forced["decision"] == "create" and forced["forced"] is True
    assert "force_create" in forced["reason"]
    superseding = ingest(school, "Alice now prefers number lines for fractions", supersedes=first)
    assert superseding.status_code == 201
    body = superseding.json()
    assert body["decision"] == "supersede"
    assert body["target_id"] == first
    old = Memory.objects.get(pk=first)
    assert old.forgotten_at is not None and old.forgotten_reason == "superseded"


def test_unrelated_text_is_created(school: School) -> None:
    ingest(school, BASE)
    body = ingest(school, "The school trip to the aquarium is on Friday").json()
    assert body["decision"] == "create"
    assert body["target_id"] is None
    assert body["prediction_error"] > 0.25


@pytest.mark.parametrize("body, field", [
    ({"kind": "dragon", "content": "x"}, "kind"),
    ({"kind": "note"}, "content"),
    ({"kind": "note", "content": "x", "force_create": "yes"}, "force_create"),
    ({"kind": "note", "content": "x", "supersedes": "not-a-uuid"}, "supersedes"),
    ({"kind": "note", "content": "x", "thresholds": {"update": "high"}}, "thresholds.update"),
    ({"kind": "note", "contnet": "x"}, "contnet"),
    # the deprecated nested shape: still read, and still checked
    ({"kind": "note", "data": "x"}, "data"),
    ({"kind": "note", "data": {}}, "content"),
    ({"kind": "note", "data": {"content": "x"}, "content": "y"}, "data"),
])
def test_bad_ingest_input_is_400_and_stores_nothing(school: School, body: dict[str, Any], field: str) -> None:
    response = school.agent.post("/api/v1/stacks/alice/ingest", body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["fields"]
    assert not Memory.objects.exists()


def test_ingest_and_feedback_isolation(school: School, other_school: School) -> None:
    memory_id = ingest(school, BASE).json()["memory"]["id"]
    _, bound_other = make_key(school.org, stack=school.other_stack)  # "bob"
    teacher = make_user(school.org, role=Membership.Role.TEACHER)
    assign_teacher(teacher, school.other_stack)
    clients = [bearer_client(bound_other), other_school.admin_api, session_client(teacher)]
    for client in clients:
        assert client.post("/api/v1/stacks/alice/ingest", {"kind": "note", "content": "sneaky"},
                           format="json").status_code == 404
        assert client.post(f"/api/v1/stacks/alice/memories/{memory_id}/feedback", {"action": "demote"},
                           format="json").status_code == 404
    # A memory id from another stack, addressed through the caller's own stack, is not found either.
    assert bearer_client(bound_other).post(f"/api/v1/stacks/bob/memories/{memory_id}/feedback",
                                           {"action": "demote"}, format="json").status_code == 404
    _, read_only = make_key(school.org, stack=school.stack, read_only=True)
    assert bearer_client(read_only).post("/api/v1/stacks/alice/ingest", {"kind": "note", "content": "ro"},
                                         format="json").status_code == 403
    assert bearer_client(read_only).post(f"/api/v1/stacks/alice/memories/{memory_id}/feedback",
                                         {"action": "promote"}, format="json").status_code == 403
    assert list(Memory.objects.values_list("text", flat=True)) == [BASE]
    assert not MemoryRevision.objects.filter(source="feedback").exists()
    assert Memory.objects.get(pk=memory_id).last_reviewed_at is None


def test_feedback_bounds_and_bad_input(school: School) -> None:
    memory_id = ingest(school, BASE).json()["memory"]["id"]
    url = f"/api/v1/stacks/alice/memories/{memory_id}/feedback"
    promoted = school.agent.post(url, {"action": "promote"}, format="json").json()
    assert promoted["stability_after"] >= 1.5 * promoted["stability_before"]
    demoted = school.agent.post(url, {"action": "demote"}, format="json").json()
    assert demoted["stability_after"] <= 0.5 * demoted["stability_before"]
    assert Memory.objects.get(pk=memory_id).stability == pytest.approx(demoted["stability_after"])
    assert Memory.objects.get(pk=memory_id).version == 1  # feedback is decay state, not content
    assert school.agent.post(url, {"action": "love"}, format="json").status_code == 400
    assert school.agent.post("/api/v1/stacks/alice/memories/nope/feedback", {"action": "promote"},
                             format="json").status_code == 404


def test_search_does_not_reinforce(school: School) -> None:
    memory_id = ingest(school, BASE).json()["memory"]["id"]
    before = Memory.objects.values("stability", "last_reviewed_at", "version").get(pk=memory_id)
    for _ in range(5):
        assert school.agent.post("/api/v1/stacks/alice/search", {"query": "fractions pizza"},
                                 format="json").json()["total"] == 1
    assert Memory.objects.values("stability", "last_reviewed_at", "version").get(pk=memory_id) == before


@pytest.mark.parametrize("new, old, expected", [
    ("Never use a calculator", "Always use a calculator", True),
    ("Actually the answer should be 3/4", "The answer is 2/3", True),
    ("She earned a badge for prefixed words", "She earned a prize", False),
    ("Use a number line", "Use a number line daily", False),
    ("Do not skip steps", "Do not skip steps ever", False),  # the old text already negates
])
def test_contradiction_heuristic_uses_word_boundaries(new: str, old: str, expected: bool) -> None:
    assert appears_contradictory(new, old) is expected
