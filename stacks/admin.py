"""Django admin for staff. Stacks are created, archived and unarchived through the API (or the
commands), never here: those paths go through stacks.services, which enforce the tier's stack
quota and write the audit log, so the admin may not add a stack nor change its status."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

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
    # Organization and status are the stack quota's inputs (moving an active stack to another school
    # would add one there); the API's archive/unarchive change the status through the service.
    readonly_fields = ["organization", "status", "memory_count", "bytes_used", "last_sync_at", "created_at",
                       "updated_at", "archived_at"]
    inlines = [TeacherAssignmentInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # stack_create enforces the stack quota and audits the creation
