"""The OpenAPI document of a memory record body: one schema per memory kind (docs/architecture.md
§3). Pure schema builders, registered with drf-spectacular by the extensions in
memories.serializers.records, next to the serializers they describe.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.plumbing import ResolvedComponent

from memories.records.fields import EXTRA_FIELD, FieldSpec, kind_fields
from memories.records.vocabulary import GOAL_STATUSES, KINDS

# --- OpenAPI: one schema per memory kind -------------------------------------------------------------
# Generated from the kinds' field lists (memories.records.fields.kind_fields, recorded from the validation
# itself), so the document cannot drift from what the API accepts. Each kind gets a component per
# body (create, update, ingest); a create or ingest body is a `oneOf` with `kind` as discriminator,
# an update body (whose kind is the stored memory's) an `anyOf`.

_FIELD_DOCS = {
    "content": "The text", "blob": "The raw text as captured (`content` or `blob`)",
    "objective": "What was attempted", "outcome": "What happened", "lessons": "Lessons learned",
    "statement": "The statement", "name": "The name", "title": "The goal's title",
    "priority": "0-100 (a goal also takes low, medium, high, urgent, critical)",
    "status": "A goal's status (any case): " + ", ".join(sorted(GOAL_STATUSES)),
    "tags": "Labels; search and list filter by them", "confidence": "How sure, 0..1",
    "expires_at": "When the memory is deleted (TTL); reads hide it from then on",
    "is_protected": "Protected memories never decay or get forgotten",
    "created_at": "When it happened (default: now)", "local_updated_at": "The client's last change",
    "derived_from": "Ids of the memories this one comes from (provenance), e.g. raw:<id>",
    "steps": "Steps: objects or strings", "drive_type": "The drive, e.g. curiosity",
    "entity_name": "Who or what the relationship is with",
}
_EXTRA_DOC = ("Fields of your own that the kind does not model, kept verbatim and returned as `extra` "
              "(an unknown key at the top level is a 400 `unknown_field`)")
_VARIANT_NAMES = {"create": "MemoryCreate", "update": "MemoryUpdate", "ingest": "SmartIngest"}


def _field_schema(spec: FieldSpec) -> dict[str, Any]:
    schema: dict[str, Any]
    if spec.type == "string":
        schema = {"type": "string", "maxLength": spec.max_length}
        if spec.choices:
            schema["enum"] = list(spec.choices)
        if spec.required:
            schema["minLength"] = 1
    elif spec.type in ("number", "integer"):
        schema = {"type": spec.type, "minimum": spec.low, "maximum": spec.high}
    elif spec.type == "boolean":
        schema = {"type": "boolean"}
    elif spec.type == "string_list":
        schema = {"type": "array", "items": {"type": "string", "maxLength": spec.max_length},
                  "maxItems": spec.max_items}
    elif spec.type == "object_list":
        schema = {"type": "array", "maxItems": spec.max_items,
                  "items": {"oneOf": [{"type": "object", "additionalProperties": True}, {"type": "string"}]}}
    elif spec.type == "timestamp":
        schema = {"type": "string", "format": "date-time"}
    elif spec.type == "goal_priority":
        schema = {"oneOf": [{"type": "integer", "minimum": spec.low, "maximum": spec.high},
                            {"type": "string", "enum": list(spec.choices)}]}
    else:  # any JSON value, kept as sent
        schema = {"description": "Any JSON value, kept as sent"}
    if "type" in schema and not spec.required:
        schema["nullable"] = True  # null means "the default"
    if spec.default is not None:
        schema["default"] = spec.default
    if spec.name in _FIELD_DOCS:
        schema["description"] = _FIELD_DOCS[spec.name]
    return schema


def _kind_schema(kind: str, variant: str, envelope: dict[str, Any]) -> dict[str, Any]:
    """One kind's body: the envelope's properties (`kind` narrowed to this kind), then its fields."""
    fields = kind_fields(kind)
    properties = {name: dict(schema) for name, schema in envelope.get("properties", {}).items()}
    required = [name for name in envelope.get("required", []) if name in properties]
    if "kind" in properties:
        # Its own enum id: drf-spectacular names an enum per choice set and warns when one set serves
        # several components (create and ingest both narrow `kind` to this kind).
        properties["kind"] = {"type": "string", "enum": [kind], "x-spec-enum-id": f"{variant}-{kind}"}
    for spec in fields.fields:
        if spec.name not in properties:  # an envelope field wins (ingest's `supersedes` over a belief's)
            properties[spec.name] = _field_schema(spec)
            if spec.required and variant != "update":
                required.append(spec.name)
    properties[EXTRA_FIELD] = {"type": "object", "additionalProperties": True, "nullable": True,
                               "description": _EXTRA_DOC}
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required
    if fields.one_of_required and variant != "update":
        schema["allOf"] = [{"anyOf": [{"required": [name]} for name in group]} for group in fields.one_of_required]
    return schema


def kind_components(auto_schema: Any, variant: str, envelope: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Register (once) the per-kind components of a body variant; their references by kind."""
    refs = {}
    for kind in KINDS:
        name = _VARIANT_NAMES[variant] + kind.capitalize()
        component = ResolvedComponent(name=name, type=ResolvedComponent.SCHEMA, object=name,
                                      schema=_kind_schema(kind, variant, envelope))
        auto_schema.registry.register_on_missing(component)
        refs[kind] = component.ref
    return refs


def kind_union(refs: dict[str, dict[str, str]], variant: str) -> dict[str, Any]:
    if variant == "update":
        return {"anyOf": list(refs.values()),
                "description": "The fields of the memory's own kind; null resets one to its default."}
    return {"oneOf": list(refs.values()),
            "discriminator": {"propertyName": "kind", "mapping": {kind: ref["$ref"] for kind, ref in refs.items()}}}
