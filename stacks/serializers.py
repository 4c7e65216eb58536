"""Wire shapes for stacks in the native API."""

from __future__ import annotations

from rest_framework import serializers

from stacks.models import Stack


class StackSerializer(serializers.ModelSerializer):
    stack_id = serializers.CharField(source="slug")

    class Meta:
        model = Stack
        fields = ["stack_id", "display_name", "kind", "status", "memory_count", "bytes_used", "last_sync_at",
                  "created_at", "updated_at", "archived_at"]
        read_only_fields = fields


class StackCreateSerializer(serializers.Serializer):
    stack_id = serializers.CharField(max_length=200, help_text="Stable id, e.g. student-4521 (kernle's alphabet)")
    display_name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    kind = serializers.ChoiceField(choices=Stack.Kind.choices, required=False, default=Stack.Kind.STUDENT)


class StackUpdateSerializer(serializers.Serializer):
    display_name = serializers.CharField(max_length=200, required=False, allow_blank=True)
    kind = serializers.ChoiceField(choices=Stack.Kind.choices, required=False)


class TeacherAssignmentSerializer(serializers.Serializer):
    user_id = serializers.CharField(max_length=32)


class GuardianInviteSerializer(serializers.Serializer):
    email = serializers.CharField(max_length=254, help_text="The guardian's e-mail address")
    name = serializers.CharField(max_length=150, required=False, allow_blank=True, default="",
                                 help_text="Optional; a new account starts with it")


class GuardianInvitedSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=["invited", "linked", "added_to_pending"],
                                     help_text="invited: a new invitation (201, with its one-time link); linked: "
                                               "already a guardian in the school, linked now; added_to_pending: "
                                               "added to the person's pending guardian invitation")
    email = serializers.CharField()
    invitation_id = serializers.CharField(allow_null=True)
    invitation_url = serializers.CharField(allow_null=True, help_text="Shown once; never stored (only its hash)")
    expires_at = serializers.DateTimeField(allow_null=True)
    emailed = serializers.BooleanField(help_text="Whether the invitation e-mail was handed to the mail server")


class GuardianSerializer(serializers.Serializer):
    email = serializers.CharField()
    name = serializers.CharField()
    state = serializers.ChoiceField(choices=["accepted", "pending", "expired"],
                                    help_text="accepted: linked; pending/expired: an invitation not used yet")
    linked_at = serializers.DateTimeField(allow_null=True)
    user_id = serializers.CharField(allow_null=True)
    invitation_id = serializers.CharField(allow_null=True)
