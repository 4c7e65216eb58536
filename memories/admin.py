"""Django admin for staff: every table of the memories app, to look at and never to write.

Memories are written only through the write kernel (memories.writes: version, revision, change
feed, counters, redaction, embedding), so no row here can be added, changed or deleted from the
admin — an admin save would bypass all of that. Vectors (`embedding`) and the generated full-text
column (`search_vector`) are never shown; memory text and data are shown read-only. Erasure
certificates are signed proofs: read-only like everything else here. Kept raw originals
(memories.privacy.originals) show which key sealed them and when — never their ciphertext, never their text.
The access log shows who was served which memory ids, through which path — it never holds text.
"""

from __future__ import annotations

from django.contrib import admin
from django.utils.text import Truncator

from accounts.admin import ReadOnlyAdmin
from memories.models import (
    BootConfigEntry,
    ChangeEvent,
    Checkpoint,
    DeploymentEmbeddingModel,
    ErasedRecord,
    ErasureCertificate,
    JobRun,
    Memory,
    MemoryAccess,
    MemoryRevision,
    MemorySalience,
    RawOriginal,
    StackDailyActivity,
    SyncWatermark,
)

PREVIEW_CHARS = 80


@admin.register(Memory)
class MemoryAdmin(ReadOnlyAdmin):
    list_display = ["record_id", "kind", "stack", "preview", "is_protected", "forgotten_at", "version",
                    "created_at"]
    list_filter = ["kind", "is_protected", ("forgotten_at", admin.EmptyFieldListFilter),
                   ("deleted_at", admin.EmptyFieldListFilter)]
    # Exact matches only: a substring search over a million memories' text would scan the table.
    search_fields = ["=record_id", "=stack__slug"]
    list_select_related = ["stack"]
    raw_id_fields = ["stack"]
    exclude = ["embedding"]  # search_vector is generated (not editable), so it never appears either
    readonly_fields = ["text", "data", "extra"]
    show_full_result_count = False  # no second COUNT(*) of the whole table on a filtered list

    @admin.display(description="text")
    def preview(self, memory: Memory) -> str:
        return Truncator(memory.text).chars(PREVIEW_CHARS)


@admin.register(MemoryRevision)
class MemoryRevisionAdmin(ReadOnlyAdmin):
    list_display = ["memory", "version", "source", "action", "created_at"]
    list_filter = ["source", "action"]
    search_fields = ["=memory__record_id"]
    list_select_related = ["memory"]
    raw_id_fields = ["memory"]
    readonly_fields = ["snapshot"]
    show_full_result_count = False


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnlyAdmin):
    list_display = ["stack", "task", "created_at"]
    search_fields = ["=stack__slug"]
    list_select_related = ["stack"]
    date_hierarchy = "created_at"


@admin.register(BootConfigEntry)
class BootConfigEntryAdmin(ReadOnlyAdmin):
    list_display = ["stack", "key", "value", "updated_at"]
    search_fields = ["=stack__slug", "key"]
    list_select_related = ["stack"]


@admin.register(JobRun)
class JobRunAdmin(ReadOnlyAdmin):
    list_display = ["name", "status", "started_at", "finished_at", "duration_ms"]
    list_filter = ["name", "status"]
    date_hierarchy = "started_at"


@admin.register(DeploymentEmbeddingModel)
class DeploymentEmbeddingModelAdmin(ReadOnlyAdmin):
    """Changed only by `manage.py reembed --switch-model` (docs/algorithms.md §10.3)."""

    list_display = ["model_id", "recorded_at", "verified_at"]


@admin.register(SyncWatermark)
class SyncWatermarkAdmin(ReadOnlyAdmin):
    list_display = ["stack", "credential_id", "pulled_at"]
    search_fields = ["=stack__slug", "=credential_id"]
    list_select_related = ["stack"]


@admin.register(MemorySalience)
class MemorySalienceAdmin(ReadOnlyAdmin):
    list_display = ["memory_id", "salience", "computed_at"]  # the id: no join to the wide memory row
    show_full_result_count = False


@admin.register(ErasureCertificate)
class ErasureCertificateAdmin(ReadOnlyAdmin):
    list_display = ["id", "organization", "stack_slug", "scope", "status", "erased_by_label", "requested_at",
                    "completed_at"]
    list_filter = ["scope", "status"]
    search_fields = ["=id", "stack_slug", "organization__slug"]
    list_select_related = ["organization"]
    date_hierarchy = "requested_at"


@admin.register(ErasedRecord)
class ErasedRecordAdmin(ReadOnlyAdmin):
    list_display = ["stack", "key_hash"]  # an id-only tombstone: SHA-256 of kind and record id, no text
    search_fields = ["=stack__slug"]
    list_select_related = ["stack"]


@admin.register(StackDailyActivity)
class StackDailyActivityAdmin(ReadOnlyAdmin):
    """The write kernel's per-stack, per-day rollup of memories written (the overview's chart)."""

    list_display = ["stack", "day", "written"]
    search_fields = ["=stack__slug"]
    list_select_related = ["stack"]
    date_hierarchy = "day"


@admin.register(ChangeEvent)
class ChangeEventAdmin(ReadOnlyAdmin):
    """The change-event outbox (docs/architecture.md §11): ids and actions, never memory text."""

    list_display = ["id", "stack", "seq", "topic", "action", "source", "created_at", "published_at"]
    list_filter = ["topic", "action", "source"]
    search_fields = ["=stack__slug"]
    list_select_related = ["stack"]
    show_full_result_count = False


@admin.register(RawOriginal)
class RawOriginalAdmin(ReadOnlyAdmin):
    list_display = ["memory_id", "key_id", "sealed_at"]
    list_filter = ["key_id"]  # which rows a key rotation has still to re-seal
    search_fields = ["=memory__id"]
    fields = ["memory_id", "key_id", "sealed_at"]  # never the ciphertext (nor, so, any text)
    readonly_fields = ["memory_id", "key_id", "sealed_at"]
    show_full_result_count = False


@admin.register(MemoryAccess)
class MemoryAccessAdmin(ReadOnlyAdmin):
    """Who was served which memories (docs/privacy.md "Access log"): ids, never text."""

    list_display = ["id", "stack", "at", "path", "agent", "key_id", "user_id"]
    list_filter = ["path"]
    search_fields = ["=stack__slug", "=agent", "=key_id"]
    list_select_related = ["stack"]
    date_hierarchy = "at"
    show_full_result_count = False
