"""Serializers of the memories routes (memories.api.memories, docs/architecture.md §3): a memory as
the API returns it, the list's query string, a batch's result, forget, checkpoints, boot config,
budget-aware load and promotion. The bodies that carry a memory record are
memories.serializers.records.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from memories.models import BootConfigEntry, Checkpoint, Memory, MemoryKind, MemoryRevision
from memories.reads.load import DEFAULT_BUDGET, MAX_BUDGET, MIN_BUDGET
from memories.records.vocabulary import ITEM_MAX, LIST_ITEMS
from memories.selectors import checkpoint_warnings, memory_revisions
from memories.serializers.fields import (
    CommaSeparatedListField,
    StrictCharField,
    StringListField,
    TimestampField,
)


class AuthorSerializer(serializers.Serializer):
    """Who wrote a memory or made a change (docs/privacy.md "Provenance"); members not known are left
    out, and a memory written before provenance was recorded has none."""

    path = serializers.CharField(required=False, help_text="How the write came: kernle | api | mcp | dashboard | job")
    key_id = serializers.CharField(required=False, help_text="The API key's public id (`key_…`)")
    key_name = serializers.CharField(required=False, help_text="The API key's name")
    user_id = serializers.IntegerField(required=False, help_text="The signed-in person (or the key's issuer)")
    user = serializers.CharField(required=False, help_text="Their e-mail")
    agent = serializers.CharField(required=False, help_text=(
        "The agent label: the `X-Agent-Id` header, the MCP client's `clientInfo.name`, or the job's name"))


class MemorySerializer(serializers.ModelSerializer):
    forgotten = serializers.SerializerMethodField()
    written_by = AuthorSerializer(read_only=True, help_text="Who wrote the memory first")
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
            "written_by",
        ]
        read_only_fields = fields

    def get_forgotten(self, obj: Memory) -> bool:
        return obj.forgotten_at is not None

    def get_awaiting_embedding(self, obj: Memory) -> bool:
        return obj.embedded_version is None  # the embedding jobs' own definition of the backlog

    def to_representation(self, instance: Memory) -> dict[str, Any]:
        """The memory as `memory_json` builds it: the same document as the fields above would make
        (tests/memories/test_memory_json.py holds them equal), without building them per request."""
        return memory_json(instance)


def _timestamp(value: datetime | None) -> str | None:
    """A timestamp as DRF's DateTimeField writes it under USE_TZ with TIME_ZONE UTC."""
    if value is None:
        return None
    text = value.astimezone(UTC).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def memory_json(memory: Memory) -> dict[str, Any]:
    """One memory as the API returns it (`MemorySerializer`'s document, docs/api.md §2).

    Built directly: DRF builds a ModelSerializer's thirty-odd fields anew for every serializer
    it makes, which was most of a write's serialization cost (docs/benchmarks.md "Web CPU").
    """
    written_by = memory.written_by or {}
    return {
        "id": str(memory.id), "kind": memory.kind, "record_id": memory.record_id, "text": memory.text,
        "data": memory.data, "extra": memory.extra, "tags": [str(t) for t in memory.tags],
        "confidence": float(memory.confidence), "source_type": memory.source_type,
        "source_entity": memory.source_entity,
        "derived_from": [str(v) for v in memory.derived_from],
        "source_episodes": [str(v) for v in memory.source_episodes],
        "emotional_valence": float(memory.emotional_valence), "emotional_arousal": float(memory.emotional_arousal),
        "emotional_tags": [str(v) for v in memory.emotional_tags],
        "subject_ids": [str(v) for v in memory.subject_ids],
        "access_grants": [str(v) for v in memory.access_grants],
        "consent_grants": [str(v) for v in memory.consent_grants],
        "strength": float(memory.strength), "times_accessed": int(memory.times_accessed),
        "last_accessed": _timestamp(memory.last_accessed), "is_protected": bool(memory.is_protected),
        "forgotten": memory.forgotten_at is not None, "forgotten_at": _timestamp(memory.forgotten_at),
        "forgotten_reason": memory.forgotten_reason, "expires_at": _timestamp(memory.expires_at),
        "version": int(memory.version), "created_at": _timestamp(memory.created_at),
        "updated_at": _timestamp(memory.server_updated_at), "size_bytes": int(memory.size_bytes),
        "awaiting_embedding": memory.embedded_version is None, "redaction_report": memory.redaction_report,
        "written_by": {name: (int(value) if name == "user_id" else str(value))
                       for name, value in written_by.items() if name in _AUTHOR_MEMBERS},
    }


_AUTHOR_MEMBERS = frozenset(AuthorSerializer().fields)


class RevisionSerializer(serializers.ModelSerializer):
    """One change of a memory: the version it changed, what it did and who did it (the state before
    it is in the stack's archive, not here)."""

    author = AuthorSerializer(read_only=True, help_text="Who made the change")

    class Meta:
        model = MemoryRevision
        fields = ["version", "action", "source", "reason", "author", "created_at"]
        read_only_fields = fields


class MemoryDetailSerializer(MemorySerializer):
    """A memory as `GET …/memories/{id}` returns it: with its newest changes (`memory_revisions`)."""

    revisions = serializers.SerializerMethodField()

    class Meta(MemorySerializer.Meta):
        fields = [*MemorySerializer.Meta.fields, "revisions"]
        read_only_fields = fields

    @extend_schema_field(RevisionSerializer(many=True))
    def get_revisions(self, obj: Memory) -> list[dict[str, Any]]:
        return list(RevisionSerializer(memory_revisions(obj), many=True).data)

    def to_representation(self, instance: Memory) -> dict[str, Any]:
        return {**memory_json(instance), "revisions": self.get_revisions(instance)}


class MemoryListQuerySerializer(serializers.Serializer):
    kind = CommaSeparatedListField(child=serializers.ChoiceField(choices=MemoryKind.choices), required=False,
                                   help_text="Kinds, comma-separated or repeated")
    tags = CommaSeparatedListField(child=serializers.CharField(), required=False,
                                   help_text="Tags, comma-separated or repeated; a memory must carry all of them")
    created_after = TimestampField(required=False)
    created_before = TimestampField(required=False)
    forgotten = serializers.ChoiceField(choices=["exclude", "include", "only"], required=False, default="exclude")

class MemoryBatchResultSerializer(serializers.Serializer):
    created = serializers.IntegerField()
    memories = MemorySerializer(many=True)


class ForgetSerializer(serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, max_length=64, default="manual")


class CheckpointContextField(serializers.JSONField):
    """An object, or a text (the seed's shape), stored as {"text": …}; null or absent: {}."""

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if isinstance(data, str):
            return {"text": data} if data.strip() else {}
        if not isinstance(data, dict):
            raise serializers.ValidationError("Must be an object or a text.")
        return dict(data)


class CheckpointInSerializer(serializers.Serializer):
    """Our shape (task, progress, next_step, blocker, context object) or the seed's (`current_task`,
    `pending` list, `context` text), or a mix: docs/api.md "Checkpoint"."""

    task = serializers.CharField(max_length=500, required=False, help_text="What the agent is doing.")
    current_task = serializers.CharField(max_length=500, required=False,
                                         help_text="The seed's name for `task`; give one of the two.")
    progress = serializers.CharField(required=False, allow_blank=True, allow_null=True, default="")
    next_step = serializers.CharField(required=False, allow_blank=True, allow_null=True, default="")
    blocker = serializers.CharField(required=False, allow_blank=True, allow_null=True, default="")
    pending = StringListField(required=False, max_length=LIST_ITEMS,
                              child=StrictCharField(allow_blank=True, max_length=ITEM_MAX),
                              help_text=f"Pending items (strings), kept in order; at most {LIST_ITEMS}.")
    context = CheckpointContextField(  # type: ignore[assignment]  # shadows Serializer.context, as before
        required=False, allow_null=True, default=dict, help_text='An object, or a text (stored as {"text": …}).')

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        task, current_task = attrs.pop("task", None), attrs.pop("current_task", None)
        if task is None and current_task is None:
            raise serializers.ValidationError({"task": ["This field is required (or `current_task`)."]})
        if task is not None and current_task is not None and task != current_task:
            raise serializers.ValidationError({"current_task": ["Differs from `task`; give one of the two."]})
        attrs["task"] = task if task is not None else current_task
        attrs["context"] = attrs.get("context") or {}
        attrs["pending"] = attrs.get("pending") or []
        return attrs


class CheckpointWarningSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()


class CheckpointSerializer(serializers.ModelSerializer):
    age_seconds = serializers.SerializerMethodField()
    warnings = serializers.SerializerMethodField()

    class Meta:
        model = Checkpoint
        fields = ["id", "task", "progress", "next_step", "blocker", "context", "pending", "saved_at",
                  "episode_record_id", "created_at", "age_seconds", "warnings"]
        read_only_fields = fields

    def get_age_seconds(self, obj: Checkpoint) -> int:
        """From the client's time when it said (`saved_at`), else from when it was stored."""
        return int((timezone.now() - (obj.saved_at or obj.created_at)).total_seconds())

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
    saved_at = serializers.DateTimeField(allow_null=True)
    pending = serializers.ListField(child=serializers.CharField())
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
