"""The hand-built memory document (`memory_json`) is the document DRF builds from
`MemorySerializer`'s declared fields — the fields the OpenAPI schema shows — for every kind and
every column a memory can carry (provenance, privacy fields, unknown fields, forgotten, expiring)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.utils import timezone
from rest_framework import serializers
from rest_framework.utils.encoders import JSONEncoder

from memories.models import Memory
from memories.serializers.memories import MemoryDetailSerializer, MemorySerializer
from tests.actors import School
from tests.memories.test_archive import _populate

pytestmark = pytest.mark.django_db


def _as_sent(document: Any) -> Any:
    return json.loads(json.dumps(document, cls=JSONEncoder))


def _field_by_field(serializer: serializers.ModelSerializer, memory: Memory) -> Any:
    return _as_sent(serializers.ModelSerializer.to_representation(serializer, memory))


def test_the_api_sends_every_memory_as_its_declared_fields_would(school: School) -> None:
    _populate(school)
    # Values the samples leave at their defaults: a fractional strength, a reader's visit, and
    # a provenance member the document does not name (left out, as DRF leaves it out).
    first = Memory.objects.filter(stack=school.stack, record_id="goal-0")
    first.update(strength=0.737, times_accessed=3, last_accessed=timezone.now(),
                 written_by={**first.get().written_by, "client_ip": "127.0.0.1"})
    memories = list(Memory.objects.filter(stack=school.stack, deleted_at__isnull=True))
    assert {m.kind for m in memories} >= {"raw", "episode", "note", "belief", "goal", "playbook"}
    assert any(m.written_by for m in memories) and any(m.forgotten_at for m in memories)
    assert any(m.expires_at for m in memories) and any(m.extra for m in memories)

    listed = school.agent.get(school.stack_url("memories"), {"limit": "100", "forgotten": "include"}).json()["results"]
    by_id = {m.pk.hex: m for m in memories}
    assert len(listed) >= len(memories) - 1  # (all but possibly none: forgotten ones included)
    for item in listed:
        memory = by_id[item["id"].replace("-", "")]
        assert item == _field_by_field(MemorySerializer(), memory), item["record_id"]

    for memory in memories:
        detail = school.agent.get(school.stack_url(f"memories/{memory.pk}")).json()
        expected = _field_by_field(MemoryDetailSerializer(), memory)
        assert detail == expected, memory.record_id
        assert set(detail) == set(MemoryDetailSerializer.Meta.fields)
