"""Isolation of every native memory endpoint: another school's key, a key bound to another stack
and an unassigned teacher get 404 (no hint the stack exists); a read-only key writing gets 403;
and none of them stores anything."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from accounts.models import Membership
from memories.models import BootConfigEntry, Checkpoint, Memory, MemoryRevision
from memories.services import CheckpointInput, boot_config_set, checkpoint_save, memory_create
from tests.factories import assign_teacher, bearer_client, make_key, make_org, make_stack, make_user

pytestmark = pytest.mark.django_db



def _session(user: Any) -> APIClient:
    client = APIClient()  # CSRF is the session layer's concern; here we test the stack decision
    client.force_login(user)
    return client


@pytest.fixture
def world() -> dict[str, Any]:
    org = make_org()
    target = make_stack(org, "target")
    neighbour = make_stack(org, "neighbour")
    memory = memory_create(stack=target, kind="note", payload={"content": "secret"}, source="test")
    memory_create(stack=target, kind="episode", source="test",
                  payload={"objective": "o", "outcome": "x", "lessons": ["a lesson"]})
    checkpoint_save(stack=target, checkpoint=CheckpointInput(task="Fractions unit"))
    boot_config_set(stack=target, key="tone", value="warm")
    other_org = make_org()
    make_stack(other_org, "elsewhere")
    _, other_school_key = make_key(other_org)
    _, bound_elsewhere = make_key(org, stack=neighbour)
    _, read_only = make_key(org, stack=target, read_only=True)
    _, own_key = make_key(org, stack=target)
    teacher = make_user(org, role=Membership.Role.TEACHER)
    assign_teacher(teacher, neighbour)
    assigned = make_user(org, role=Membership.Role.TEACHER)
    assign_teacher(assigned, target)
    return {
        "target": target, "memory": memory,
        "outsiders": {
            "other_school_key": bearer_client(other_school_key),
            "key_bound_elsewhere": bearer_client(bound_elsewhere),
            "unassigned_teacher": _session(teacher),
        },
        "read_only": bearer_client(read_only),
        "own": bearer_client(own_key),
        "assigned_teacher": _session(assigned),
    }


def _endpoints(memory_id: str) -> list[tuple[str, str, Any, bool]]:
    """(method, path, body, is_write) for every endpoint of the native memory API."""
    base = "/api/v1/stacks/target"
    m = f"{base}/memories/{memory_id}"
    return [
        ("get", f"{base}/memories", None, False),
        ("post", f"{base}/memories", {"kind": "note", "content": "intruder"}, True),
        ("post", f"{base}/memories/batch", {"items": [{"kind": "note", "content": "intruder"}]}, True),
        ("get", m, None, False),
        ("patch", m, {"content": "overwritten"}, True),
        ("post", f"{m}/forget", {"reason": "x"}, True),
        ("post", f"{m}/recover", {}, True),
        ("post", f"{m}/protect", {}, True),
        ("post", f"{m}/unprotect", {}, True),
        ("get", f"{base}/checkpoint", None, False),
        ("post", f"{base}/checkpoint", {"task": "intruder"}, True),
        ("get", f"{base}/checkpoint/history", None, False),
        ("get", f"{base}/boot-config", None, False),
        ("get", f"{base}/boot-config/tone", None, False),
        ("put", f"{base}/boot-config/tone", {"value": "cold"}, True),
        ("put", f"{base}/boot-config/new", {"value": "x"}, True),
        ("delete", f"{base}/boot-config/tone", None, True),
        ("get", f"{base}/load", None, False),
        ("get", f"{base}/export/memory.md", None, False),
        ("post", f"{base}/promote", {"auto": True}, True),
        ("post", f"{base}/promote", {"auto": False}, False),
    ]


def _state(target: Any) -> tuple[Any, ...]:
    return (
        list(Memory.objects.filter(stack=target).order_by("id").values_list(
            "id", "version", "data", "is_protected", "forgotten_at", "times_accessed")),
        Checkpoint.objects.filter(stack=target).count(),
        list(BootConfigEntry.objects.filter(stack=target).values_list("key", "value")),
        MemoryRevision.objects.count(),
    )


def _call(client: APIClient, method: str, url: str, body: Any) -> Any:
    if body is None:
        return getattr(client, method)(url)
    return getattr(client, method)(url, body, format="json")


@pytest.mark.parametrize("who", ["other_school_key", "key_bound_elsewhere", "unassigned_teacher"])
def test_outsiders_get_404_everywhere_and_change_nothing(world: dict[str, Any], who: str) -> None:
    before = _state(world["target"])
    client = world["outsiders"][who]
    for method, url, body, _ in _endpoints(str(world["memory"].pk)):
        response = _call(client, method, url, body)
        assert response.status_code == 404, (who, method, url, response.status_code)
        assert b"secret" not in response.content
    assert _state(world["target"]) == before


def test_read_only_key_reads_but_cannot_write(world: dict[str, Any]) -> None:
    for method, url, body, is_write in _endpoints(str(world["memory"].pk)):
        before = _state(world["target"])
        response = _call(world["read_only"], method, url, body)
        if is_write:
            assert response.status_code == 403, (method, url, response.status_code)
            assert response.json()["error"]["code"] == "read_only_key"
            assert _state(world["target"]) == before, (method, url)
        else:
            assert response.status_code == 200, (method, url, response.status_code)


@pytest.mark.parametrize("who", ["own", "assigned_teacher"])
def test_the_stack_own_key_and_assigned_teacher_reach_everything(world: dict[str, Any], who: str) -> None:
    for method, url, body, _ in _endpoints(str(world["memory"].pk)):
        response = _call(world[who], method, url, body)
        assert response.status_code < 300 or response.status_code == 409, (method, url, response.status_code)
