"""DRF serializers of the memories API: the request serializers are both the validation and the
OpenAPI schema of every body and query string (`@extend_schema(request=…, parameters=[…])`); the
response serializers render and document what comes back.

Two things are deliberately not parsed here:

* the values of a memory record's fields (a belief's `statement`, a goal's `priority`, …): every
  memory write — this API, batch, smart ingest and kernle sync — checks them with the one per-kind
  schema, `memories.records.normalize.normalize_memory`, in the service. A body that carries a record
  (`MemoryRecordSerializer`) checks its envelope here, refuses keys the kind does not have
  (`memories.records.fields.native_record`: a 400 `unknown_field` with the closest known field; fields a
  kind does not model go under `extra`) and hands the record on. Kernle sync does not come
  through here and keeps unknown fields (docs/kernle-protocol.md §3.7). The OpenAPI document of
  these bodies — one schema per memory kind — is generated from the same field list
  (`MemoryRecordSchemaExtension`);
* the sync push operations (memories.api.sync): see that module for why.

Rules (who may do what, which stack) live in selectors and services, never here. The strict
input fields the request serializers are built from are in memories.serializer_fields.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.plumbing import ResolvedComponent
from rest_framework import serializers

from memories.models import BootConfigEntry, Checkpoint, Memory, MemoryKind
from memories.reads.load import DEFAULT_BUDGET, MAX_BUDGET, MIN_BUDGET
from memories.records.fields import EXTRA_FIELD, FieldSpec, kind_fields, native_record
from memories.records.vocabulary import GOAL_STATUSES, KINDS
from memories.search.query import DEFAULT_MIN_SIMILARITY, MAX_LIMIT, MAX_QUERY_CHARS, SearchQuery
from memories.search.retrieval_feedback import DEMOTE, PROMOTE
from memories.search.smart_ingest import Thresholds
from memories.selectors import checkpoint_warnings
from memories.serializer_fields import (
    KERNLE_DEFAULT_KINDS,
    ClampedFloatField,
    ClampedIntegerField,
    CommaSeparatedListField,
    MemoryKindListField,
    StrictBooleanField,
    StrictCharField,
    StrictUUIDField,
    StringListField,
    TimestampField,
)
from memories.services import BATCH_MAX_ITEMS, RECORD_ID_MAX
from memoryhub.errors import InvalidInput

SEARCH_MAX_LIST_ITEMS = 50  # kinds or tags in one search
SEARCH_MAX_STACKS = 1000


def validated(serializer_class: type[serializers.Serializer], data: Any,
              context: dict[str, Any] | None = None) -> dict[str, Any]:
    """`data` checked by `serializer_class`; a ValidationError becomes the API's 400 with field errors
    (memoryhub.errors). A body that is not a JSON object is refused the same way
    (`non_field_errors`)."""
    serializer = serializer_class(data=data, context=context or {})
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


# --- memories ----------------------------------------------------------------------------------------

class MemorySerializer(serializers.ModelSerializer):
    forgotten = serializers.SerializerMethodField()
    updated_at = serializers.DateTimeField(source="server_updated_at", read_only=True)
    awaiting_embedding = serializers.SerializerMethodField()

    class Meta:
        model = Memory
        fields = [
            "id", "kind", "record_id", "text", "data", "extra", "tags", "confidence", "source_type",
            "source_entity", "derived_from", "source_episodes", "emotional_valence", "emotional_arousal",
            "emotional_tags", "subject_ids", "access_grants", "consent_grants", "strength", "times_accessed",
            "last_accessed", "is_protected", "forgotten", "forgotten_at", "forgotten_reason", "expires_at",
            "version", "created_at", "updated_at", "size_bytes", "awaiting_embedding", "redaction_report",
        ]
        read_only_fields = fields

    def get_forgotten(self, obj: Memory) -> bool:
        return obj.forgotten_at is not None

    def get_awaiting_embedding(self, obj: Memory) -> bool:
        return obj.embedded_version is None  # the embedding jobs' own definition of the backlog


class MemoryListQuerySerializer(serializers.Serializer):
    kind = CommaSeparatedListField(child=serializers.ChoiceField(choices=MemoryKind.choices), required=False,
                                   help_text="Kinds, comma-separated or repeated")
    tags = CommaSeparatedListField(child=serializers.CharField(), required=False,
                                   help_text="Tags, comma-separated or repeated; a memory must carry all of them")
    created_after = TimestampField(required=False)
    created_before = TimestampField(required=False)
    forgotten = serializers.ChoiceField(choices=["exclude", "include", "only"], required=False, default="exclude")


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


class MemoryBatchResultSerializer(serializers.Serializer):
    created = serializers.IntegerField()
    memories = MemorySerializer(many=True)


class ForgetSerializer(serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, max_length=64, default="manual")


class CheckpointInSerializer(serializers.Serializer):
    task = serializers.CharField(max_length=500)
    progress = serializers.CharField(required=False, allow_blank=True, allow_null=True, default="")
    next_step = serializers.CharField(required=False, allow_blank=True, allow_null=True, default="")
    blocker = serializers.CharField(required=False, allow_blank=True, allow_null=True, default="")
    context = serializers.DictField(required=False, allow_null=True, default=dict)  # type: ignore[assignment]


class CheckpointWarningSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()


class CheckpointSerializer(serializers.ModelSerializer):
    age_seconds = serializers.SerializerMethodField()
    warnings = serializers.SerializerMethodField()

    class Meta:
        model = Checkpoint
        fields = ["id", "task", "progress", "next_step", "blocker", "context", "created_at", "age_seconds",
                  "warnings"]
        read_only_fields = fields

    def get_age_seconds(self, obj: Checkpoint) -> int:
        return int((timezone.now() - obj.created_at).total_seconds())

    @staticmethod
    def _warnings(obj: Checkpoint) -> list[dict[str, str]]:
        return [{"code": w.code, "message": w.message} for w in checkpoint_warnings(obj)]

    def get_warnings(self, obj: Checkpoint) -> list[dict[str, Any]]:
        return self._warnings(obj)


class BootConfigValueSerializer(serializers.Serializer):
    value = serializers.CharField(allow_blank=True, trim_whitespace=False)


class BootConfigEntrySerializer(serializers.ModelSerializer):
    class Meta:
        model = BootConfigEntry
        fields = ["key", "value", "updated_at"]
        read_only_fields = fields


class LoadQuerySerializer(serializers.Serializer):
    # Refused outside its range (400 naming `budget`), not clamped: a load of 10 tokens cannot be
    # served as one of 100, nor -5 as anything (docs/algorithms.md §8.1).
    budget = serializers.IntegerField(required=False, min_value=MIN_BUDGET, max_value=MAX_BUDGET,
                                      help_text=f"Token budget, {MIN_BUDGET}-{MAX_BUDGET}; default {DEFAULT_BUDGET}.")
    item_chars = serializers.IntegerField(required=False, min_value=-(2**31), max_value=2**31,
                                          help_text="Per-item character cap; default 500, clamped to 10-10000.")
    no_truncate = serializers.BooleanField(required=False, default=False,
                                           help_text="Lift the per-item cap to its maximum (10000).")


class LoadedMemorySerializer(serializers.Serializer):
    id = serializers.CharField()
    kind = serializers.CharField()
    record_id = serializers.CharField()
    text = serializers.CharField()
    score = serializers.FloatField()
    tokens = serializers.IntegerField()
    truncated = serializers.BooleanField()
    created_at = serializers.DateTimeField()
    details = serializers.DictField()


class LoadCheckpointSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    task = serializers.CharField()
    created_at = serializers.DateTimeField()
    text = serializers.CharField()
    tokens = serializers.IntegerField()
    truncated = serializers.BooleanField()
    warnings = CheckpointWarningSerializer(many=True)


class LoadEchoSerializer(serializers.Serializer):
    id = serializers.CharField()
    kind = serializers.CharField()
    hint = serializers.CharField()
    score = serializers.FloatField()


class LoadMetaSerializer(serializers.Serializer):
    budget_total = serializers.IntegerField()
    budget_used = serializers.IntegerField()
    excluded_count = serializers.IntegerField()
    item_chars = serializers.IntegerField()


class LoadResultSerializer(serializers.Serializer):
    checkpoint = LoadCheckpointSerializer(allow_null=True)
    boot_config = serializers.DictField(child=serializers.CharField())
    memories = LoadedMemorySerializer(many=True)
    echoes = LoadEchoSerializer(many=True)
    meta = LoadMetaSerializer()
    generated_at = serializers.DateTimeField()


class PromoteInSerializer(serializers.Serializer):
    auto = serializers.BooleanField(required=False, default=False,
                                    help_text="Create the beliefs (default: only suggest).")
    limit = serializers.IntegerField(required=False, default=50, min_value=1, max_value=200)


class PromotionSuggestionSerializer(serializers.Serializer):
    lesson = serializers.CharField()
    normalized = serializers.CharField()
    occurrences = serializers.IntegerField()
    episode_ids = serializers.ListField(child=serializers.CharField())
    belief_id = serializers.CharField(allow_null=True)


class PromotionResultSerializer(serializers.Serializer):
    episodes_scanned = serializers.IntegerField()
    created = serializers.IntegerField()
    skipped_existing = serializers.IntegerField()
    reason = serializers.CharField()
    suggestions = PromotionSuggestionSerializer(many=True)


# --- search, smart ingest, feedback ------------------------------------------------------------------

class SearchInSerializer(serializers.Serializer):
    """A hybrid search of one stack."""

    query = StrictCharField(max_length=MAX_QUERY_CHARS)
    limit = ClampedIntegerField(low=1, high=MAX_LIMIT, default=10, allow_null=True,
                                help_text=f"Clamped to 1..{MAX_LIMIT}")
    kinds = MemoryKindListField(required=False, allow_null=True, max_length=SEARCH_MAX_LIST_ITEMS,
                                help_text="Memory kinds: " + ", ".join(MemoryKind.values) + " (kernle's plural "
                                          "table names too); default: all")
    tags = StringListField(required=False, allow_null=True, max_length=SEARCH_MAX_LIST_ITEMS,
                           help_text="Any of these tags")
    created_after = TimestampField(required=False, allow_null=True)
    created_before = TimestampField(required=False, allow_null=True)
    min_similarity = ClampedFloatField(low=0.0, high=1.0, default=DEFAULT_MIN_SIMILARITY, allow_null=True,
                                       help_text="Semantic leg only; clamped to 0..1")

    kinds_field = "kinds"
    default_kinds: tuple[str, ...] = ()

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """The body as the search engine's query: `validated_data["search"]`."""
        attrs["search"] = SearchQuery(
            text=attrs["query"], limit=attrs["limit"],
            kinds=tuple(attrs.get(self.kinds_field) or self.default_kinds), tags=tuple(attrs.get("tags") or ()),
            created_after=attrs.get("created_after"), created_before=attrs.get("created_before"),
            min_similarity=attrs["min_similarity"],
        )
        return attrs


class SchoolSearchInSerializer(SearchInSerializer):
    """A search across the stacks of a school."""

    stacks = StringListField(required=False, allow_null=True, max_length=SEARCH_MAX_STACKS,
                             help_text="Slugs to search; default: every stack of the school")


class KernleSearchInSerializer(SearchInSerializer):
    """kernle's `POST /memories/search` (docs/kernle-protocol.md §5.1)."""

    kinds = None  # type: ignore[assignment]  # kernle names them memory_types
    memory_types = MemoryKindListField(required=False, allow_null=True, max_length=SEARCH_MAX_LIST_ITEMS,
                                       help_text="episodes, notes, beliefs, values, goals (singular too); "
                                                 "default: those five")
    stack_id = StrictCharField(required=False, allow_null=True, allow_blank=True, trim_whitespace=False,
                               help_text="Extension: which stack (else the key's bound stack, else the most "
                                         "recently pushed one)")

    kinds_field = "memory_types"
    default_kinds = KERNLE_DEFAULT_KINDS


class SmartIngestInSerializer(MemoryWriteSerializer):
    """A memory to ingest: the body of a memory create (`kind`, the kind's fields flat, `extra`)
    plus the ingest options below. For a belief, `supersedes` is the ingest option (a memory id).

    Deprecated, still accepted: the kind's fields under `data` (`{"kind": "note", "data":
    {"content": …}}`), the body of earlier releases; the response then carries a
    `Deprecation: true` header. Sending fields both flat and under `data` is a 400."""

    openapi_variant = "ingest"

    record_id = None  # type: ignore[assignment]  # smart ingest decides which memory it writes
    force_create = StrictBooleanField(required=False, default=False,
                                      help_text="Store a new memory whatever the gate would decide")
    supersedes = StrictUUIDField(required=False, allow_null=True,
                                 help_text="Explicitly supersede this memory (its id): the new memory is "
                                           "created and the old one forgotten")
    thresholds = serializers.DictField(required=False, allow_null=True,
                                       help_text="Numbers: near_identical, update, correction (cosine; clamped 0..1)")
    data = serializers.DictField(  # type: ignore[assignment]
        required=False, help_text="Deprecated: the kind's fields, nested. Send them flat.")

    def validate_thresholds(self, value: dict[str, Any] | None) -> Thresholds:
        # Smart ingest reads (and clamps) its own thresholds; its errors name the key
        # (`thresholds.update`), as a nested serializer's would not.
        return Thresholds.from_request(value)

    def read_record(self, envelope: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
        nested = envelope.pop("data", None)
        envelope["deprecated_shape"] = nested is not None
        if nested is not None:
            if record:
                raise InvalidInput("Send the memory's fields flat, or (deprecated) under `data`, not both.",
                                   fields={"data": ["Not together with the fields flat: "
                                                    + ", ".join(sorted(map(str, record))) + "."]})
            record = nested
        return super().read_record(envelope, record)


class RetrievalFeedbackInSerializer(serializers.Serializer):
    action = serializers.ChoiceField(choices=[PROMOTE, DEMOTE])
    reason = StrictCharField(required=False, allow_null=True, allow_blank=True, trim_whitespace=False, default="")


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


class MemoryRecordSchemaExtension(OpenApiSerializerExtension):
    """A record body in the OpenAPI document: one schema per memory kind (see above)."""

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
