"""DRF serializers of the memories API: the request serializers are both the validation and the
OpenAPI schema of every body and query string (`@extend_schema(request=…, parameters=[…])`); the
response serializers render and document what comes back.

Two things are deliberately not parsed here:

* the fields of a memory record (a belief's `statement`, a goal's `priority`, …): every memory
  write — this API, batch, smart ingest and kernle sync — checks them with the one per-kind
  schema, `memories.schemas.normalize_memory`, in the service. A body that carries a record
  (`MemoryRecordSerializer`) checks its envelope here and hands the record on untouched;
* the sync push operations (memories.api.sync): see that module for why.

Rules (who may do what, which stack) live in selectors and services, never here. The strict
input fields the request serializers are built from are in memories.serializer_fields.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.extensions import OpenApiSerializerExtension
from rest_framework import serializers

from memories.models import BootConfigEntry, Checkpoint, Memory, MemoryKind
from memories.search.hybrid import DEFAULT_MIN_SIMILARITY, MAX_LIMIT, MAX_QUERY_CHARS, SearchQuery
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
from memories.services import RECORD_ID_MAX

SEARCH_MAX_LIST_ITEMS = 50  # kinds or tags in one search
SEARCH_MAX_STACKS = 1000


def validated(serializer_class: type[serializers.Serializer], data: Any) -> dict[str, Any]:
    """`data` checked by `serializer_class`; a ValidationError becomes the API's 400 with field errors
    (memoryhub.errors). A body that is not a JSON object is refused the same way
    (`non_field_errors`)."""
    serializer = serializer_class(data=data)
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
            "version", "created_at", "updated_at", "size_bytes", "awaiting_embedding",
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
    comes out untouched as `validated_data["record"]`, for the service to check with the kind's
    schema (memories.schemas.normalize_memory, the one schema of every memory write)."""

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        envelope = dict(super().to_internal_value(data))  # refuses a body that is not an object
        envelope["record"] = {key: value for key, value in data.items() if key not in self.fields}
        return envelope


class MemoryRecordSchemaExtension(OpenApiSerializerExtension):
    """In the OpenAPI document a record body is an open object: the declared envelope, then any of
    the kind's fields (drf-spectacular would otherwise drop a body that declares no field)."""

    target_class = MemoryRecordSerializer
    match_subclasses = True

    def map_serializer(self, auto_schema: Any, direction: Any) -> Any:
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        schema["additionalProperties"] = {
            "description": "The kind's fields (e.g. a belief's statement, tags, confidence), checked by the "
                           "memory schema of every write; fields a kind does not model are kept in `extra`"}
        return schema


class MemoryWriteSerializer(MemoryRecordSerializer):
    """A memory to create: `kind`, optionally `record_id`, then the kind's fields flat, e.g.
    `{"kind": "belief", "statement": "Pictures help with fractions", "confidence": 0.9,
    "tags": ["math"]}`. Fields a kind does not model are kept (`extra`)."""

    kind = serializers.ChoiceField(choices=MemoryKind.choices)
    record_id = StrictCharField(required=False, allow_null=True, max_length=RECORD_ID_MAX,
                                remove_control_characters=True,
                                help_text="The client's id for the record, unique per kind in the stack; "
                                          "default: the memory's id")


class MemoryUpdateSerializer(MemoryRecordSerializer):
    """A partial update: any of the memory's fields, e.g. `{"statement": "…", "tags": ["math"]}`;
    null resets a field to its default. The result is checked as a whole, with the kind's schema."""


class MemoryBatchSerializer(serializers.Serializer):
    items = serializers.ListField(
        child=serializers.DictField(),
        help_text="Create bodies (`kind`, `record_id`, the kind's fields), at most 500; all are stored or none")


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
    budget = serializers.IntegerField(required=False, min_value=-(2**31), max_value=2**31,
                                      help_text="Token budget; default 8000, clamped to 100-50000.")
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


class SmartIngestInSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=MemoryKind.choices)
    data = serializers.DictField(help_text="The memory's fields, as for creating one")  # type: ignore[assignment]
    force_create = StrictBooleanField(required=False, default=False)
    supersedes = StrictUUIDField(required=False, allow_null=True, help_text="Explicitly supersede this memory")
    thresholds = serializers.DictField(required=False, allow_null=True,
                                       help_text="Numbers: near_identical, update, correction (cosine; clamped 0..1)")

    def validate_thresholds(self, value: dict[str, Any] | None) -> Thresholds:
        # Smart ingest reads (and clamps) its own thresholds; its errors name the key
        # (`thresholds.update`), as a nested serializer's would not.
        return Thresholds.from_request(value)


class RetrievalFeedbackInSerializer(serializers.Serializer):
    action = serializers.ChoiceField(choices=[PROMOTE, DEMOTE])
    reason = StrictCharField(required=False, allow_null=True, allow_blank=True, trim_whitespace=False, default="")
