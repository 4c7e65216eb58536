"""Serializers of the search routes (memories.api.search): hybrid search (one stack, school-wide and
kernle's), smart ingest and retrieval feedback. A search body comes out as a `SearchQuery`
(memories.search.query); smart ingest's body is a create body (memories.serializers.records) with
its own envelope fields.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from memories.models import MemoryKind
from memories.search.query import DEFAULT_MIN_SIMILARITY, MAX_LIMIT, MAX_QUERY_CHARS, SearchQuery
from memories.search.retrieval_feedback import DEMOTE, PROMOTE
from memories.search.smart_ingest import Thresholds
from memories.serializers.fields import (
    KERNLE_DEFAULT_KINDS,
    ClampedFloatField,
    ClampedIntegerField,
    MemoryKindListField,
    StrictBooleanField,
    StrictCharField,
    StrictUUIDField,
    StringListField,
    TimestampField,
)
from memories.serializers.records import MemoryWriteSerializer
from memoryhub.errors import InvalidInput

SEARCH_MAX_LIST_ITEMS = 50  # kinds or tags in one search
SEARCH_MAX_STACKS = 1000

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
