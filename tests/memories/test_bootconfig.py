"""Boot config: set, get, list, delete; validation; first in load and export."""

from __future__ import annotations

from typing import Any

import pytest

from memories.models import BootConfigEntry
from tests.actors import School

pytestmark = pytest.mark.django_db



@pytest.fixture
def url(school: School) -> str:
    return school.stack_url("boot-config")


def test_set_get_list_overwrite_delete(school: School, url: str) -> None:
    client = school.agent
    assert client.put(f"{url}/tutor.name", {"value": "Ada"}, format="json").status_code == 200
    assert client.put(f"{url}/grade", {"value": "5"}, format="json").status_code == 200
    assert client.get(f"{url}/tutor.name").json()["value"] == "Ada"
    assert client.put(f"{url}/tutor.name", {"value": "Grace"}, format="json").json()["value"] == "Grace"
    assert [(e["key"], e["value"]) for e in client.get(url).json()] == [("grade", "5"), ("tutor.name", "Grace")]
    assert client.delete(f"{url}/grade").status_code == 204
    assert client.get(f"{url}/grade").status_code == 404
    assert client.delete(f"{url}/grade").status_code == 404
    assert list(BootConfigEntry.objects.values_list("key", "value")) == [("tutor.name", "Grace")]


@pytest.mark.parametrize(("key", "body", "field"), [
    ("bad key!", {"value": "x"}, "key"),
    ("k" * 101, {"value": "x"}, "key"),
    ("ok", {"value": "x" * 10_001}, "value"),
    ("ok", {}, "value"),
    ("ok", {"value": {"nested": 1}}, "value"),
])
def test_invalid_boot_config_is_400_and_nothing_stored(school: School, url: str, key: str, body: dict[str, Any],
                                                       field: str) -> None:
    response = school.agent.put(f"{url}/{key}", body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["fields"]
    assert not BootConfigEntry.objects.exists()


def test_first_in_export_and_load(school: School, url: str) -> None:
    school.agent.put(f"{url}/tone", {"value": "warm"}, format="json")
    school.agent.post(f"/api/v1/stacks/{school.stack.slug}/memories",
                      {"kind": "value", "name": "care", "statement": "be kind"}, format="json")
    md = school.agent.get(f"/api/v1/stacks/{school.stack.slug}/export/memory.md").content.decode()
    assert md.index("## Boot Config") < md.index("## Values")
    assert "- **tone**: warm" in md
    loaded = school.agent.get(f"/api/v1/stacks/{school.stack.slug}/load").json()
    assert loaded["boot_config"] == {"tone": "warm"}
