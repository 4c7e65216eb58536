"""Checkpoints: save, latest, history; warnings when stale (> 6 h) or generically named."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from memories.models import Checkpoint
from tests.actors import School

pytestmark = pytest.mark.django_db



@pytest.fixture
def url(school: School) -> str:
    return school.stack_url("checkpoint")


def test_save_load_latest_and_history(school: School, url: str) -> None:
    client = school.agent
    assert client.get(url).status_code == 404
    first = client.post(url, {"task": "Fractions unit", "progress": "3 of 5", "next_step": "decimals",
                              "blocker": "", "context": {"lesson": 4}}, format="json")
    assert first.status_code == 201, first.json()
    second = client.post(url, {"task": "Decimals unit", "progress": "started"}, format="json")
    latest = client.get(url).json()
    assert latest["id"] == second.json()["id"]
    assert latest["task"] == "Decimals unit"
    assert latest["warnings"] == []
    history = client.get(url + "/history").json()["results"]
    assert [c["task"] for c in history] == ["Decimals unit", "Fractions unit"]
    assert history[1]["context"] == {"lesson": 4}


def test_stale_checkpoint_warns(school: School, url: str) -> None:
    created = school.agent.post(url, {"task": "Fractions unit"}, format="json").json()
    Checkpoint.objects.filter(pk=created["id"]).update(created_at=timezone.now() - timedelta(hours=6, minutes=5))
    body = school.agent.get(url).json()
    assert [w["code"] for w in body["warnings"]] == ["stale"]
    assert "6 hours" in body["warnings"][0]["message"]
    assert body["age_seconds"] >= 6 * 3600


@pytest.mark.parametrize("task", ["auto-save", "checkpoint", "Checkpoint", "AUTO-SAVE "])
def test_generic_task_name_warns(school: School, url: str, task: str) -> None:
    body = school.agent.post(url, {"task": task}, format="json").json()
    assert [w["code"] for w in body["warnings"]] == ["generic_task"]


@pytest.mark.parametrize(("body", "field"), [
    ({}, "task"), ({"task": ""}, "task"), ({"task": "x" * 501}, "task"),
    ({"task": "t", "progress": "p" * 10_001}, "progress"), ({"task": "t", "context": [1]}, "context"),
    ({"task": "t", "context": {"k": "x" * 40_000}}, "context"),
])
def test_invalid_checkpoint_is_400_and_nothing_stored(school: School, url: str, body: dict[str, Any],
                                                      field: str) -> None:
    response = school.agent.post(url, body, format="json")
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]
    assert not Checkpoint.objects.exists()


def test_control_characters_stripped(school: School, url: str) -> None:
    body = school.agent.post(url, {"task": "Frac\x00tions", "context": {"k\x00": "v\x07"}},
                             format="json").json()
    assert body["task"] == "Fractions"
    assert body["context"] == {"k": "v"}
