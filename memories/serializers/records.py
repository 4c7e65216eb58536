"""The bodies that are, or carry, a memory record: create, update, a batch of creates (and, by
subclassing the create, smart ingest's). The declared fields are the envelope; every other key
belongs to the record and must be a field of its kind (`memories.records.fields.native_record`:
a 400 `unknown_field` naming the closest known field). The record's values are the service's to
check, with the one per-kind schema (memories.records.normalize.normalize_memory).

The OpenAPI document describes each of these bodies as one schema per memory kind, built by
memories.serializers.openapi; the two extensions below register that with drf-spectacular when
this module is imported, which every view using these serializers does.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiSerializerExtension
from rest_framework import serializers

from memories.models import MemoryKind
from memories.records.fields import native_record
from memories.serializers.fields import (
    StrictCharField,
)
from memories.serializers.openapi import kind_components, kind_union
from memories.services import BATCH_MAX_ITEMS, RECORD_ID_MAX
from memoryhub.errors import InvalidInput


class MemoryRecordSerializer(serializers.Serializer):
    """A body that is a memory record, or carries one flat beside a few envelope fields.

    The declared fields (the envelope) are checked here; every other key belongs to the record and
    must be a field of the record's kind (`kind` in the body, or `context["kind"]` for an update):
    `memories.records.fields.native_record` refuses the others with a 400 `unknown_field` and unpacks
    `extra`. The record comes out as `validated_data["record"]`, for the service to check with the
    kind's schema (memories.records.normalize.normalize_memory, the one schema of every memory write)."""

    # Which per-kind OpenAPI schemas document this body (MemoryRecordSchemaExtension).
    openapi_variant = "create"

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        envelope = dict(super().to_internal_value(data))  # refuses a body that is not an object
        record = {key: value for key, value in data.items() if key not in self.fields}
        envelope["record"] = self.read_record(envelope, record)
        return envelope

    def read_record(self, envelope: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
        kind = envelope.get("kind") or self.context.get("kind")
        return native_record(kind, record) if kind else record


class MemoryWriteSerializer(MemoryRecordSerializer):
    """A memory to create: `kind`, optionally `record_id`, then the kind's fields flat, e.g.
    `{"kind": "belief", "statement": "Pictures help with fractions", "confidence": 0.9,
    "tags": ["math"]}`. A key the kind does not have is a 400 (`unknown_field`); fields of your own
    go under `extra`."""

    kind = serializers.ChoiceField(choices=MemoryKind.choices)
    record_id = StrictCharField(required=False, allow_null=True, max_length=RECORD_ID_MAX,
                                remove_control_characters=True,
                                help_text="The client's id for the record, unique per kind in the stack; "
                                          "default: the memory's id")


class MemoryUpdateSerializer(MemoryRecordSerializer):
    """A partial update: any of the fields of the memory's kind, e.g. `{"statement": "…", "tags":
    ["math"]}`; null resets a field to its default; `extra` adds or changes fields of your own. The
    result is checked as a whole, with the kind's schema. The view passes the memory's kind as
    `context["kind"]`."""

    openapi_variant = "update"


class MemoryBatchSerializer(serializers.Serializer):
    # How many items (at least one, at most BATCH_MAX_ITEMS: else 413) is the service's rule.
    items = serializers.ListField(
        child=serializers.DictField(),
        help_text=f"Create bodies (`kind`, `record_id`, the kind's fields), at most {BATCH_MAX_ITEMS}; all are "
                  f"stored or none")

    def validate_items(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each item's keys, as for a create: every unknown key of every item is named at once
        (`items.<index>.<field>`); values are the service's to check."""
        checked: list[dict[str, Any]] = []
        errors: dict[str, Any] = {}
        for index, item in enumerate(items):
            kind = item.get("kind")
            envelope = {name: item[name] for name in ("kind", "record_id") if name in item}
            record = {name: value for name, value in item.items() if name not in envelope}
            try:
                record = native_record(kind, record, prefix=f"items.{index}.") if isinstance(kind, str) else record
            except InvalidInput as exc:
                errors.update(exc.fields)
                continue
            checked.append({**envelope, **record})
        if errors:
            raise InvalidInput("Some items have fields their kind does not know.", code="unknown_field",
                               fields=errors)
        return checked


class MemoryRecordSchemaExtension(OpenApiSerializerExtension):
    """A record body in the OpenAPI document: one schema per memory kind (memories.serializers.openapi)."""

    target_class = MemoryRecordSerializer
    match_subclasses = True

    def map_serializer(self, auto_schema: Any, direction: Any) -> Any:
        envelope = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        envelope.get("properties", {}).pop("data", None)  # ingest's deprecated nesting: described, not offered
        variant = self.target.openapi_variant
        schema = kind_union(kind_components(auto_schema, variant, envelope), variant)
        description = (self.target.__doc__ or "").strip()
        if description:
            schema["description"] = " ".join(description.split())
        return schema


class MemoryBatchSchemaExtension(OpenApiSerializerExtension):
    """A batch's items: create bodies, one schema per kind, as for a single create."""

    target_class = MemoryBatchSerializer

    def map_serializer(self, auto_schema: Any, direction: Any) -> Any:
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        envelope = auto_schema._map_serializer(MemoryWriteSerializer(), direction, bypass_extensions=True)
        items = schema["properties"]["items"]
        items.update(items=kind_union(kind_components(auto_schema, "create", envelope), "create"),
                     minItems=1, maxItems=BATCH_MAX_ITEMS)
        return schema
