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
