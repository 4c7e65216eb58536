from __future__ import annotations

from django.contrib import admin

from stacks.models import Stack, TeacherAssignment


class TeacherAssignmentInline(admin.TabularInline):
    model = TeacherAssignment
    extra = 0
    raw_id_fields = ["user"]


@admin.register(Stack)
class StackAdmin(admin.ModelAdmin):
    list_display = ["slug", "organization", "display_name", "kind", "status", "memory_count", "bytes_used",
                    "last_sync_at"]
    list_filter = ["status", "kind"]
    search_fields = ["slug", "display_name"]
    readonly_fields = ["memory_count", "bytes_used", "last_sync_at", "created_at", "updated_at", "archived_at"]
    inlines = [TeacherAssignmentInline]
