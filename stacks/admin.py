"""Django admin for staff. Stacks are created, archived and unarchived through the API (or the
commands), never here: those paths go through stacks.services, which enforce the tier's stack
quota and write the audit log, so the admin may not add a stack nor change its status. Teacher
assignments likewise: assigning and unassigning are audited, and unassigning ends the keys the
teacher issued for the stack (stacks.services), so the admin shows them read-only."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from accounts.admin import ReadOnlyAdmin
from stacks.models import GuardianLink, GuardianRequest, Stack, StackConsent, TeacherAssignment


class TeacherAssignmentInline(admin.TabularInline):
    model = TeacherAssignment
    extra = 0
    fields = ["user", "created_at"]
    readonly_fields = ["user", "created_at"]
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Stack)
class StackAdmin(admin.ModelAdmin):
    list_display = ["slug", "organization", "display_name", "grade", "kind", "status", "memory_count", "bytes_used",
                    "last_sync_at", "last_write_at", "created_at"]
    list_filter = ["status", "kind"]
    search_fields = ["slug", "display_name", "organization__slug"]
    list_select_related = ["organization"]
    date_hierarchy = "created_at"
    # Organization and status are the stack quota's inputs (moving an active stack to another school
    # would add one there); the API's archive/unarchive change the status through the service.
    readonly_fields = ["organization", "status", "created_by", "memory_count", "bytes_used", "last_sync_at",
                       "last_write_at", "created_at", "updated_at", "archived_at", "consent_given_at",
                       "paused_at", "paused_by"]
    inlines = [TeacherAssignmentInline]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # stack_create enforces the stack quota and audits the creation


@admin.register(TeacherAssignment)
class TeacherAssignmentAdmin(ReadOnlyAdmin):
    list_display = ["stack", "user", "created_at"]
    search_fields = ["stack__slug", "user__email", "stack__organization__slug"]
    list_select_related = ["stack", "user"]


@admin.register(GuardianLink)
class GuardianLinkAdmin(ReadOnlyAdmin):
    """Links are made by accepting an invitation and removed by a school admin (audited), not here."""

    list_display = ["stack", "user", "created_by", "created_at"]
    search_fields = ["stack__slug", "user__email", "stack__organization__slug"]
    list_select_related = ["stack", "user", "created_by"]


@admin.register(StackConsent)
class StackConsentAdmin(ReadOnlyAdmin):
    """The consent history is a record: read-only."""

    list_display = ["stack", "action", "method", "by_user", "created_at"]
    list_filter = ["action", "method"]
    search_fields = ["stack__slug", "stack__organization__slug"]
    list_select_related = ["stack", "by_user"]


@admin.register(GuardianRequest)
class GuardianRequestAdmin(ReadOnlyAdmin):
    """Guardians' requests are decided by school admins on the dashboard (audited), not here."""

    list_display = ["id", "stack", "kind", "scope", "status", "requested_by", "due_at", "decided_at"]
    list_filter = ["kind", "status"]
    search_fields = ["stack__slug", "stack__organization__slug"]
    list_select_related = ["stack", "requested_by"]
