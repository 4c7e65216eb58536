"""Wire shapes for keys, people and the audit log (kernle auth and the native API)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.utils import timezone
from rest_framework import serializers

from accounts.models import ApiKey, AuditEvent, Membership


def iso(value: datetime | None) -> str | None:
    """ISO-8601 with an explicit offset (the kernle CLI needs one, docs/kernle-protocol.md §1.4)."""
    if value is None:
        return None
    if timezone.is_naive(value):
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat()


def key_is_active(key: ApiKey) -> bool:
    return key.revoked_at is None and (key.expires_at is None or key.expires_at > timezone.now())


def key_summary(key: ApiKey) -> dict[str, Any]:
    """One key as `GET /auth/keys` and the native list show it. Never the secret."""
    return {
        "id": key.public_id,
        "key_id": key.public_id,
        "name": key.name,
        "key_prefix": key.key_prefix,
        "stack_id": key.stack.slug if key.stack_id and key.stack else None,
        "read_only": key.read_only,
        "stack_agent": key.stack_agent,
        "issued_by_key": key.issued_by_key or None,
        "created_at": iso(key.created_at),
        "last_used_at": iso(key.last_used_at),
        "expires_at": iso(key.expires_at),
        "revoked_at": iso(key.revoked_at),
        "is_active": key_is_active(key),
    }


def key_with_secret(key: ApiKey, secret: str) -> dict[str, Any]:
    """A just-created key: the only time its secret is ever shown (both kernle spellings)."""
    return {**key_summary(key), "key": secret, "api_key": secret}


def key_cycled(old_key: ApiKey, new_key: ApiKey, secret: str) -> dict[str, Any]:
    """A cycle's answer: the new key as flat fields (what the kernle CLI reads) plus the legacy
    nested shape `{old_key_id, new_key: {…}}` (docs/kernle-protocol.md §2.7)."""
    body = key_with_secret(new_key, secret)
    body["old_key_id"] = old_key.public_id
    body["new_key"] = {"id": new_key.public_id, "key": secret, "name": new_key.name}
    return body


class KeySummarySerializer(serializers.Serializer):
    id = serializers.CharField()
    key_id = serializers.CharField()
    name = serializers.CharField()
    key_prefix = serializers.CharField()
    stack_id = serializers.CharField(allow_null=True)
    read_only = serializers.BooleanField()  # type: ignore[assignment]  # shadows Field.read_only by name only
    stack_agent = serializers.BooleanField(help_text=(
        "True: the student's own agent key — it reads every memory of its stack, also those shared only with "
        "the student. False: it reads what its issuer may read (docs/privacy.md \"Keys and the grants\")."))
    issued_by_key = serializers.CharField(allow_null=True, help_text=(
        "The school key that issued this key, whose privacy grants it reads with; null when a person issued it "
        "(it then reads with that person's)."))
    created_at = serializers.DateTimeField()
    last_used_at = serializers.DateTimeField(allow_null=True)
    expires_at = serializers.DateTimeField(allow_null=True)
    revoked_at = serializers.DateTimeField(allow_null=True)
    is_active = serializers.BooleanField()


class KeyCreatedSerializer(KeySummarySerializer):
    key = serializers.CharField(help_text="The secret, shown once.")
    api_key = serializers.CharField(help_text="The secret again (kernle reads either spelling).")


class KeyCycledSerializer(KeyCreatedSerializer):
    old_key_id = serializers.CharField()
    new_key = serializers.DictField()


class KernleKeyCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100, required=False, allow_blank=True, allow_null=True, default="")


class KernleRegisterSerializer(serializers.Serializer):
    """Accepts the 0.15.0 body {stack_id, email} and the legacy {agent_id, display_name?, email?}.
    Validation happens in the service (stack-id alphabet, email); this documents the shape."""

    stack_id = serializers.CharField(required=False)
    agent_id = serializers.CharField(required=False)
    email = serializers.CharField(required=False, allow_null=True, allow_blank=True)
    display_name = serializers.CharField(required=False, allow_null=True, allow_blank=True)


class KernleRegisteredSerializer(serializers.Serializer):
    user_id = serializers.CharField()
    secret = serializers.CharField()
    api_key = serializers.CharField()
    key_id = serializers.CharField()
    access_token = serializers.CharField()
    token_type = serializers.CharField()
    expires_in = serializers.IntegerField()
    stack_id = serializers.CharField()


class KernleLoginSerializer(serializers.Serializer):
    user_id = serializers.CharField()
    token = serializers.CharField()
    token_expires = serializers.DateTimeField()
    token_type = serializers.CharField()
    expires_in = serializers.IntegerField()
    stack_id = serializers.CharField(allow_null=True)


class KernleMeSerializer(serializers.Serializer):
    user_id = serializers.CharField()
    email = serializers.CharField(allow_null=True)
    organization_id = serializers.CharField()
    organization_kind = serializers.CharField()
    tier = serializers.CharField()
    key_id = serializers.CharField(allow_null=True)
    stack_id = serializers.CharField(allow_null=True)
    read_only = serializers.BooleanField()  # type: ignore[assignment]


class KeyIssueSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")
    stack_id = serializers.CharField(max_length=100, required=False, allow_null=True, default=None,
                                     help_text="Bind the key to this stack; omit for a school-wide key.")
    read_only = serializers.BooleanField(required=False, default=False)  # type: ignore[assignment]
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None)
    stack_agent = serializers.BooleanField(required=False, default=False, help_text=(
        "This key is the student's own agent: it reads every memory of its stack, also those shared only with "
        "the student (`access_grants` no member of staff passes), like the agent the student registered "
        "themself. Needs `stack_id` and a school admin or a writable school key (a teacher: 403 "
        "`stack_agent_needs_admin`); audited as `key.issued_as_stack_agent`. Off (the default): the key reads "
        "what you, its issuer, may read — your own privacy grants, or your school key's."))

    def validate_expires_at(self, value: datetime | None) -> datetime | None:
        if value is not None and value <= timezone.now():
            raise serializers.ValidationError("Must be in the future.")
        return value


class MemberSerializer(serializers.Serializer):
    user_id = serializers.CharField(source="user.public_id")
    email = serializers.EmailField(source="user.email")
    username = serializers.CharField(source="user.username")
    first_name = serializers.CharField(source="user.first_name")
    last_name = serializers.CharField(source="user.last_name")
    role = serializers.ChoiceField(choices=Membership.Role.choices)
    created_at = serializers.DateTimeField()


class MemberCreateSerializer(serializers.Serializer):
    email = serializers.EmailField()
    role = serializers.ChoiceField(choices=Membership.Role.choices)
    password = serializers.CharField(required=False, allow_blank=True, write_only=True, min_length=8, max_length=128)
    first_name = serializers.CharField(required=False, allow_blank=True, max_length=150, default="")
    last_name = serializers.CharField(required=False, allow_blank=True, max_length=150, default="")


class MemberCreatedSerializer(MemberSerializer):
    initial_password = serializers.CharField(help_text="Shown once; the person should change it.")


class AuditEventSerializer(serializers.ModelSerializer):
    actor_id = serializers.CharField(source="actor.public_id", allow_null=True, default=None)
    actor_key_id = serializers.CharField(source="actor_key.public_id", allow_null=True, default=None)

    class Meta:
        model = AuditEvent
        fields = ["id", "action", "actor_id", "actor_key_id", "target_type", "target_id", "ip", "metadata",
                  "created_at"]
