"""Django admin for staff: snapshots and codes are shown, never edited here (teleport.services keep
blobs, quotas and the audit log in step). Neither a code nor its hash is shown."""

from __future__ import annotations

from django.contrib import admin

from accounts.admin import ReadOnlyAdmin
from teleport.models import Snapshot, TeleportCode


@admin.register(Snapshot)
class SnapshotAdmin(ReadOnlyAdmin):
    list_display = ["id", "stack", "name", "stored_bytes", "file_count", "created_at", "expires_at"]
    raw_id_fields = ["stack"]


@admin.register(TeleportCode)
class TeleportCodeAdmin(ReadOnlyAdmin):
    list_display = ["snapshot", "one_time", "created_at", "expires_at", "used_at"]
    exclude = ["code_hash"]
