"""Django admin for staff (is_staff) at /admin/.

Secrets are never shown: an API key appears by its prefix only (its hash is excluded from every
page), an invitation without its token hash. What a school does through the API or the dashboard
— issuing keys, changing roles, removing members — stays there, because those services audit the
change and end what must end with it (a removed member's keys and sessions); here those rows are
read-only. The audit log is read-only too.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin
from django.http import HttpRequest

from accounts.models import ApiKey, AuditEvent, Invitation, Membership, Organization, User


class ReadOnlyAdmin(admin.ModelAdmin):
    """Staff may look, not change: the rows are written by services that audit what they do."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(User)
class UserAdmin(DjangoUserAdmin):
    list_display = ["email", "username", "public_id", "is_staff", "is_superuser", "is_active", "last_login",
                    "date_joined"]
    search_fields = ["email", "username", "public_id"]
    readonly_fields = ["public_id", "last_login", "date_joined"]
    date_hierarchy = "date_joined"


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    fields = ["user", "role", "created_at"]
    readonly_fields = ["user", "role", "created_at"]
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # members join by invitation or the API, which audit it


@admin.register(Organization)
class OrganizationAdmin(admin.ModelAdmin):
    """The one place an operator changes a school's plan (`tier`) or policy."""

    list_display = ["name", "slug", "public_id", "kind", "tier", "teachers_may_manage_keys", "created_at"]
    list_filter = ["kind", "tier", "teachers_may_manage_keys"]
    search_fields = ["name", "slug", "public_id"]
    readonly_fields = ["public_id", "created_at"]
    date_hierarchy = "created_at"
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(ReadOnlyAdmin):
    list_display = ["user", "organization", "role", "created_at"]
    list_filter = ["role"]
    search_fields = ["user__email", "user__username", "organization__slug", "organization__name"]
    list_select_related = ["user", "organization"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["public_id", "name", "key_prefix", "organization", "stack", "user", "read_only", "stack_agent",
                    "expires_at", "revoked_at", "last_used_at", "created_at"]
    list_filter = ["read_only", "stack_agent", ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["public_id", "key_prefix", "name", "organization__slug", "user__email"]
    list_select_related = ["organization", "stack", "user"]
    date_hierarchy = "created_at"
    exclude = ["key_hash"]  # never shown, not even read-only: the prefix identifies a key
    # What a key may read (stack_agent, issued_by_key) is chosen when it is issued, audited, and never
    # changed afterwards: not here either.
    readonly_fields = ["public_id", "key_prefix", "organization", "user", "stack", "stack_agent", "issued_by_key",
                       "replaced_by", "last_used_at", "created_at"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # keys are issued through the API so the secret is shown exactly once


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "organization", "action", "actor", "actor_key", "target_type", "target_id", "ip"]
    list_filter = ["action", "target_type"]
    search_fields = ["target_id", "action", "organization__slug", "actor__email"]
    list_select_related = ["organization", "actor", "actor_key"]
    date_hierarchy = "created_at"



@admin.register(Invitation)
class InvitationAdmin(ReadOnlyAdmin):
    """Invitations are made and revoked on the dashboard's People page (audited; the link is shown
    to the admin once). The token's hash is excluded: it would be a lookup key for the link."""

    list_display = ["email", "organization", "role", "invited_by", "created_at", "expires_at", "accepted_at",
                    "revoked_at"]
    list_filter = ["role", ("accepted_at", admin.EmptyFieldListFilter), ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["email", "public_id", "organization__slug"]
    list_select_related = ["organization", "invited_by"]
    date_hierarchy = "created_at"
    exclude = ["token_hash"]
