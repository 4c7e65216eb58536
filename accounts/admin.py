"""Django admin for staff. Keys are shown by prefix only; their hash is never editable, and
the audit log is read-only."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin
from django.http import HttpRequest

from accounts.models import ApiKey, AuditEvent, Membership, Organization, User

admin.site.register(User, UserAdmin)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    raw_id_fields = ["user"]


@admin.register(Organization)
class OrganizationAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "kind", "tier", "teachers_may_manage_keys", "created_at"]
    list_filter = ["kind", "tier"]
    search_fields = ["name", "slug", "public_id"]
    inlines = [MembershipInline]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["public_id", "name", "key_prefix", "organization", "stack", "read_only", "expires_at",
                    "revoked_at", "last_used_at"]
    list_filter = ["read_only"]
    search_fields = ["public_id", "key_prefix", "name"]
    readonly_fields = ["public_id", "key_prefix", "key_hash", "organization", "user", "stack", "replaced_by",
                       "last_used_at", "created_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # keys are issued through the API so the secret is shown exactly once


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ["created_at", "organization", "action", "actor", "target_type", "target_id", "ip"]
    list_filter = ["action"]
    search_fields = ["target_id", "action"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
