"""Kernle checkpoints are checkpoints (docs/kernle-protocol.md §3.12), the native checkpoint takes the
seed's shape (docs/api.md "Checkpoint"), and a school may let its school key create a student's stack
on the first push (§3.4). Through HTTP, against the real database."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from accounts.models import AuditEvent, Organization
from accounts.throttles import throttle_state_clear
from dashboard import student as dashboard_reads
from memories.models import ChangeEvent, Checkpoint, Memory
from memories.reads.export import stack_memory_md
from stacks.models import Stack
from tests.actors import School, school_cast
from tests.dashboard.pages import client_for
from tests.factories import bearer_client, make_key, make_stack, session_client

pytestmark = pytest.mark.django_db

TASK = "Fractions unit, lesson 3"
PENDING = ["Mark the quiz", "Start decimals"]


@pytest.fixture(autouse=True)
def _fresh_throttles() -> Iterator[None]:
    throttle_state_clear()
    yield


def checkpoint_data(record_id: str, *, task: str = TASK, pending: list[str] | None = None,
                    context: str | None = "Halfway through equivalent fractions",
                    saved: datetime | None = None, **fields: Any) -> dict[str, Any]:
    """What kernle 0.15 queues for `kernle checkpoint save` (kernle/core/checkpoint.py)."""
    when = (saved or timezone.now()).isoformat()
    data = {"id": record_id, "objective": f"[CHECKPOINT] {task}", "outcome": context or "Working state checkpoint",
            "outcome_type": "partial", "lessons": PENDING if pending is None else pending,
            "tags": ["checkpoint", "working_state"], "source_type": "observation",
            "source_entity": "kernle:checkpoint", "created_at": when, "local_updated_at": when, "version": 1,
            "deleted": False, "strength": 1.0}
    data.update(fields)
    return data


def kernle_op(record_id: str, **kwargs: Any) -> dict[str, Any]:
    data = checkpoint_data(record_id, **kwargs)
    return {"operation": "update", "table": "episodes", "record_id": record_id,
            "local_updated_at": data["local_updated_at"], "version": 1, "data": data}


def kernle_push(client: Any, slug: str, operations: list[Any]) -> Any:
    return client.post("/sync/push", {"stack_id": slug, "operations": operations}, format="json")


def checkpoint_of(client: Any, slug: str) -> Any:
    return client.get(f"/api/v1/stacks/{slug}/checkpoint")


# --- the signature, through both pushes ------------------------------------------------------------------

def test_kernle_push_saves_the_checkpoint_with_pending_items_and_client_time(school: School) -> None:
    saved = datetime(2026, 11, 28, 9, 30, tzinfo=UTC)
    response = kernle_push(school.agent, "alice", [kernle_op("cp-1", saved=saved)])
    assert response.status_code == 200 and response.json()["conflicts"] == [], response.content
    body = checkpoint_of(school.agent, "alice").json()
    assert body["task"] == TASK
    assert body["pending"] == PENDING
    assert body["context"] == {"text": "Halfway through equivalent fractions"}
    assert datetime.fromisoformat(body["saved_at"]) == saved
    assert body["episode_record_id"] == "cp-1"
    # The episode is kept for kernle to pull back; the change event fires as for a native save.
    assert Memory.objects.filter(stack=school.stack, kind="episode", record_id="cp-1").exists()
    assert ChangeEvent.objects.filter(stack=school.stack, topic="checkpoint", action="save").count() == 1


def test_native_push_saves_the_checkpoint_too(school: School) -> None:
    op = {"op": "upsert", "kind": "episode", "record_id": "cp-n", "data": checkpoint_data("cp-n", pending=["Quiz"])}
    response = school.agent.post(school.stack_url("sync/push"), {"operations": [op]}, format="json")
    assert response.status_code == 200 and response.json()["applied"] == 1, response.content
    body = checkpoint_of(school.agent, "alice").json()
    assert (body["task"], body["pending"], body["episode_record_id"]) == (TASK, ["Quiz"], "cp-n")


def test_a_repush_creates_no_second_checkpoint_and_no_error(school: School) -> None:
    op = kernle_op("cp-1")
    for _ in range(2):
        response = kernle_push(school.agent, "alice", [op])
        assert response.status_code == 200 and response.json()["conflicts"] == []
    # The native push of the same episode is still the same episode.
    native = {"op": "upsert", "kind": "episode", "record_id": "cp-1", "data": op["data"]}
    assert school.agent.post(school.stack_url("sync/push"), {"operations": [native]},
                             format="json").json()["applied"] == 1
    assert Checkpoint.objects.filter(stack=school.stack).count() == 1
    assert ChangeEvent.objects.filter(stack=school.stack, topic="checkpoint").count() == 1


def test_only_the_full_signature_makes_a_checkpoint(school: School) -> None:
    ops = [kernle_op("only-tag", objective="Fractions"),  # no [CHECKPOINT] prefix
           kernle_op("one-tag", tags=["checkpoint"]),  # not both tags
           {"operation": "update", "table": "notes", "record_id": "note-1",
            "data": {"content": "[CHECKPOINT] not an episode", "tags": ["checkpoint", "working_state"]}}]
    assert kernle_push(school.agent, "alice", ops).json()["conflicts"] == []
    assert not Checkpoint.objects.exists()


def test_a_refused_episode_saves_no_checkpoint(school: School) -> None:
    refused = kernle_op("too-long", task="x" * 20_001)
    body = kernle_push(school.agent, "alice", [refused, kernle_op("fine")]).json()
    assert [c["record_id"] for c in body["conflicts"]] == ["too-long"]
    assert list(Checkpoint.objects.values_list("episode_record_id", flat=True)) == ["fine"]


def test_several_in_one_push_the_newest_is_the_checkpoint_and_history_keeps_the_rest(school: School) -> None:
    now = timezone.now()
    ops = [kernle_op("new", task="Lesson 4", saved=now),
           kernle_op("old", task="Lesson 3", saved=now - timedelta(hours=1))]
    kernle_push(school.agent, "alice", ops)
    assert checkpoint_of(school.agent, "alice").json()["task"] == "Lesson 4"
    history = school.agent.get(school.stack_url("checkpoint/history")).json()["results"]
    assert [c["task"] for c in history] == ["Lesson 4", "Lesson 3"]


def test_kernle_default_outcome_is_no_context(school: School) -> None:
    kernle_push(school.agent, "alice", [kernle_op("cp", context=None, pending=[])])
    body = checkpoint_of(school.agent, "alice").json()
    assert body["context"] == {} and body["pending"] == []


# --- reading it back: load, warnings, MEMORY.md, the dashboard ---------------------------------------------

def test_load_puts_the_checkpoint_first_and_does_not_count_its_episode(school: School) -> None:
    kernle_push(school.agent, "alice", [kernle_op("cp-1")])
    school.agent.post(school.stack_url("memories"), {"kind": "episode", "objective": "Solved 3/4 + 1/8",
                                                     "outcome": "correct"}, format="json")
    body = school.agent.get(school.stack_url("load")).json()
    assert body["checkpoint"]["task"] == TASK
    assert body["checkpoint"]["pending"] == PENDING
    assert "Mark the quiz" in body["checkpoint"]["text"]
    assert [m["record_id"] for m in body["memories"] if m["kind"] == "episode"] != []
    assert all(TASK not in m["text"] for m in body["memories"])
    assert all(TASK not in e["hint"] for e in body["echoes"])


def test_stale_is_measured_from_the_client_time(school: School) -> None:
    kernle_push(school.agent, "alice", [kernle_op("cp-old", saved=timezone.now() - timedelta(hours=7))])
    body = checkpoint_of(school.agent, "alice").json()
    assert [w["code"] for w in body["warnings"]] == ["stale"]
    assert body["age_seconds"] >= 7 * 3600
    fresh = school.agent.post(school.stack_url("checkpoint"), {"task": "Decimals"}, format="json").json()
    assert fresh["warnings"] == [] and fresh["saved_at"] is None


def test_memory_md_shows_pending_items_and_the_saved_time(school: School) -> None:
    saved = datetime(2026, 11, 28, 9, 30, tzinfo=UTC)
    kernle_push(school.agent, "alice", [kernle_op("cp-1", saved=saved)])
    text = stack_memory_md(stack=school.stack)
    section = text[text.index("## Last Checkpoint"):]
    assert f"- **Task**: {TASK}" in section
    assert "- **Context**: Halfway through equivalent fractions" in section
    assert "  - Mark the quiz\n  - Start decimals" in section
    assert "- **Saved**: 2026-11-28 09:30 UTC" in section


def test_dashboard_shows_it_in_the_checkpoint_panel_not_among_the_episodes(school: School) -> None:
    school.agent.post(school.stack_url("checkpoint"), {"task": "Warm-up"}, format="json")
    kernle_push(school.agent, "alice", [kernle_op("cp-1")])
    counts = dashboard_reads.kind_counts(school.stack, dashboard_reads.MemoryFilters.of({}), audience=None)
    assert counts["episode"] == 0
    page = session_client(school.admin).get(f"/dashboard/students/{school.stack.slug}/").content.decode()
    panel = page[page.index('id="live-checkpoint"'):]
    assert TASK in panel and "Mark the quiz" in panel
    assert "Earlier checkpoints" in panel and "Warm-up" in panel
    assert "No checkpoint saved yet" not in page
    # The list is empty, but the agent is evidently connected: the page does not say to connect one.
    assert "besides the agent's checkpoint" in page and "kernle auth login" not in page


# --- the native checkpoint in the seed's shape -----------------------------------------------------------

def test_native_checkpoint_accepts_the_seed_shape(school: School) -> None:
    url = school.stack_url("checkpoint")
    body = {"current_task": TASK, "pending": PENDING, "context": "Halfway through"}
    response = school.agent.post(url, body, format="json")
    assert response.status_code == 201, response.content
    stored = checkpoint_of(school.agent, "alice").json()
    assert (stored["task"], stored["pending"], stored["context"]) == (TASK, PENDING, {"text": "Halfway through"})
    put = school.agent.put(url, {"task": "Lesson 4", "pending": [], "context": {"lesson": 4}}, format="json")
    assert put.status_code == 201, put.content
    assert checkpoint_of(school.agent, "alice").json()["context"] == {"lesson": 4}
    assert Checkpoint.objects.filter(stack=school.stack).count() == 2


@pytest.mark.parametrize(("body", "field"), [
    ({"current_task": TASK, "pending": "Mark the quiz"}, "pending"),
    ({"current_task": TASK, "pending": [1, 2]}, "pending"),
    ({"current_task": TASK, "pending": [{"item": "x"}]}, "pending"),
    ({"current_task": TASK, "context": 5}, "context"),
    ({"current_task": TASK, "context": ["a"]}, "context"),
    ({"task": "A", "current_task": "B"}, "current_task"),
    ({"pending": ["x"]}, "task"),
    ({"current_task": ""}, "current_task"),
    ({"current_task": TASK, "pending": ["x" * 2_001]}, "pending"),
])
def test_bad_seed_shapes_are_400_and_nothing_is_stored(school: School, body: dict[str, Any], field: str) -> None:
    response = school.agent.post(school.stack_url("checkpoint"), body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["fields"], response.json()
    assert not Checkpoint.objects.exists()


# --- provisioning on push ---------------------------------------------------------------------------------

def _school_key(school: School, *, read_only: bool = False) -> Any:
    _, secret = make_key(school.org, user=school.admin, read_only=read_only, name="tutor fleet")
    return bearer_client(secret)


def test_provisioning_off_is_a_404_naming_the_setting(school: School) -> None:
    response = kernle_push(school.admin_api, "carol", [kernle_op("cp-1")])
    assert response.status_code == 404
    assert "provision_stacks_on_push" in response.json()["error"]["message"]
    assert not Stack.objects.filter(slug="carol").exists()
    assert not Checkpoint.objects.exists()


def test_provisioning_on_creates_the_student_stack_and_its_checkpoint(school: School) -> None:
    Organization.objects.filter(pk=school.org.pk).update(provision_stacks_on_push=True)
    response = kernle_push(school.admin_api, "carol", [kernle_op("cp-1")])
    assert response.status_code == 200 and response.json()["conflicts"] == [], response.content
    carol = Stack.objects.get(organization=school.org, slug="carol")
    assert carol.kind == Stack.Kind.STUDENT
    assert Checkpoint.objects.get(stack=carol).task == TASK


def test_provisioning_is_for_writable_school_wide_keys_only(school: School) -> None:
    Organization.objects.filter(pk=school.org.pk).update(provision_stacks_on_push=True)
    read_only = kernle_push(_school_key(school, read_only=True), "carol", [kernle_op("a")])
    assert read_only.status_code == 404 and "provision_stacks_on_push" not in read_only.json()["error"]["message"]
    bound = kernle_push(school.agent, "carol", [kernle_op("a")])
    assert bound.status_code == 404 and bound.json()["error"]["code"] == "stack_not_reachable"
    assert not Stack.objects.filter(slug="carol").exists()


def test_provisioning_respects_the_plan_stack_limit(school: School) -> None:
    Organization.objects.filter(pk=school.org.pk).update(provision_stacks_on_push=True, tier="free")
    body = kernle_push(school.admin_api, "carol", [kernle_op("cp-1")]).json()
    assert [c["error"] for c in body["conflicts"]] and "stack limit" in body["conflicts"][0]["error"]
    assert not Stack.objects.filter(slug="carol").exists()
    assert not Checkpoint.objects.exists()


def test_another_school_cannot_provision_into_or_read_a_stack_of_this_school(school: School) -> None:
    other = school_cast("Other school")
    Organization.objects.filter(pk=other.org.pk).update(provision_stacks_on_push=True)
    kernle_push(school.agent, "alice", [kernle_op("alice-cp", task="Alice's own work")])
    # The other school's key naming "alice" reaches (or creates) its own "alice", never this school's.
    kernle_push(other.admin_api, "alice", [kernle_op("intruder", task="Written by the other school")])
    assert Stack.objects.filter(slug="alice").count() == 2
    assert list(Checkpoint.objects.filter(stack=school.stack).values_list("task", flat=True)) == ["Alice's own work"]
    assert checkpoint_of(other.admin_api, "alice").json()["task"] == "Written by the other school"
    # Provisioning a brand-new id creates it in the other school only.
    kernle_push(other.admin_api, "dave", [kernle_op("d")])
    assert list(Stack.objects.filter(slug="dave").values_list("organization_id", flat=True)) == [other.org.pk]
    assert checkpoint_of(school.admin_api, "dave").status_code == 404
    # This school's agent key cannot reach the other school's stack at all.
    assert kernle_push(school.agent, "dave", [kernle_op("x")]).status_code == 404


def test_a_bound_stack_of_another_school_is_not_reachable_by_provisioning(school: School) -> None:
    other = school_cast("Third school")
    make_stack(other.org, "erin")
    Organization.objects.filter(pk=school.org.pk).update(provision_stacks_on_push=True)
    # This school's key creates its own "erin"; the other school's "erin" gets nothing.
    kernle_push(school.admin_api, "erin", [kernle_op("e")])
    theirs = Stack.objects.get(organization=other.org, slug="erin")
    assert not Memory.objects.filter(stack=theirs).exists() and not Checkpoint.objects.filter(stack=theirs).exists()


# --- the setting, for school admins -----------------------------------------------------------------------

def test_admins_toggle_the_setting_through_the_api_with_an_audit_event(school: School) -> None:
    response = school.admin_api.put("/api/v1/privacy", {"provision_stacks_on_push": True}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["provision_stacks_on_push"] is True
    assert Organization.objects.get(pk=school.org.pk).provision_stacks_on_push is True
    event = AuditEvent.objects.filter(organization=school.org, action="privacy.updated").latest("id")
    assert event.metadata["changed"]["provision_stacks_on_push"] == {"from": False, "to": True}
    assert school.admin_api.put("/api/v1/privacy", {"provision_stacks_on_push": "yes"},
                                format="json").status_code == 400
    # A stack-bound agent key may not change it.
    assert school.agent.put("/api/v1/privacy", {"provision_stacks_on_push": False}, format="json").status_code == 403
    assert Organization.objects.get(pk=school.org.pk).provision_stacks_on_push is True


def test_admins_toggle_the_setting_on_the_dashboard_privacy_page(school: School) -> None:
    client = client_for(school.admin)
    page = client.get("/dashboard/privacy/").content.decode()
    assert 'name="provision_stacks_on_push"' in page and "Create students&#x27; stacks on first push" in page
    form = {"redaction_categories": ["EMAIL", "PHONE", "IP_ADDRESS"], "empty_grants_policy": "school",
            "provision_stacks_on_push": "on"}
    response = client.post("/dashboard/privacy/", form)
    assert response.status_code == 302, response.content
    assert Organization.objects.get(pk=school.org.pk).provision_stacks_on_push is True
    event = AuditEvent.objects.filter(organization=school.org, action="privacy.updated").latest("id")
    assert event.metadata["changed"]["provision_stacks_on_push"] == {"from": False, "to": True}
    # The school key's first push now creates the student.
    assert kernle_push(school.admin_api, "carol", [kernle_op("cp-1")]).status_code == 200
    assert Stack.objects.filter(organization=school.org, slug="carol").exists()
