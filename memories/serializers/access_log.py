"""The access log's query string and rows (`GET /api/v1/stacks/{stack}/access-log`,
docs/privacy.md "Access log")."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from accounts.authors import AGENT_LABEL_MAX
from memories.reads.access_log import AccessPath
from memories.serializers.fields import StrictUUIDField, TimestampField


class AccessLogQuerySerializer(serializers.Serializer):
    memory = StrictUUIDField(required=False, help_text="Only requests that were served this memory id")
    agent = serializers.CharField(required=False, max_length=AGENT_LABEL_MAX,
                                  help_text="Only readers with this agent label (X-Agent-Id, the MCP client)")
    person = serializers.CharField(required=False, max_length=254,
                                   help_text="Only readers acting as this person: a user id (`usr_…`) or e-mail")
    path = serializers.ChoiceField(required=False, choices=list(AccessPath.ALL),
                                   help_text="Only reads of this kind")
    since = TimestampField(required=False, help_text="Only reads at or after this time (ISO 8601)")
    until = TimestampField(required=False, help_text="Only reads before this time (ISO 8601)")

    def validate_person(self, value: str) -> str:
        if "\x00" in value or not value.strip():
            raise serializers.ValidationError("A user id (usr_…) or an e-mail address.")
        return value.strip()

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        since, until = attrs.get("since"), attrs.get("until")
        if since is not None and until is not None and until <= since:
            raise serializers.ValidationError({"until": ["Must be after `since`."]})
        return attrs


class AccessReaderSerializer(serializers.Serializer):
    path = serializers.CharField(help_text="The reader's channel: api | kernle | mcp | dashboard | webhook")
    key_id = serializers.CharField(required=False, help_text=(
        "The credential's public id: an API key's (`key_…`) or a webhook endpoint's (`whk_…`)"))
    key_name = serializers.CharField(required=False)
    user_id = serializers.IntegerField(required=False)
    user = serializers.CharField(required=False, help_text="The person's (or the key issuer's) e-mail")
    agent = serializers.CharField(required=False, help_text="The agent label")


class MemoryAccessSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    at = serializers.DateTimeField()
    path = serializers.CharField(help_text=" | ".join(AccessPath.ALL))
    reader = AccessReaderSerializer(source="author")
    memory_ids = serializers.ListField(child=serializers.UUIDField())
