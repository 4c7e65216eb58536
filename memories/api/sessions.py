"""POST /api/v1/stacks/<stack>/sessions: a session becomes an episode and its memory card
(memories/sessions/cards.py; docs/algorithms.md §12). `dry_run` (or Lumera's `metadata.dry_run`)
returns the card and the redaction report and stores nothing; Lumera's whole body shape is accepted
(§12.4). Write access to the stack is needed either way (as for the redaction preview: a dry run
must not probe a stack the caller could not write to)."""

from __future__ import annotations

import difflib
from typing import Any

from django.urls import path
from drf_spectacular.utils import OpenApiExample, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.authors import Path, request_author
from accounts.principal import principal_of
from memories.privacy.redaction.policy import stack_policy
from memories.serializers import validated
from memories.serializers.memories import MemorySerializer
from memories.sessions.cards import (
    RAW_EXPORT_PHRASE,
    SESSION_FIELDS,
    SESSION_MODES,
    SUMMARY_MAX,
    session_options,
    session_prepare,
    session_store,
)
from memoryhub.errors import InvalidInput
from stacks.selectors import stack_for_principal

TAG = "memories"


class SessionSerializer(serializers.Serializer):
    """The allowlist: these fields and nothing else (an unknown key is a 400 `unknown_field`)."""

    session_id = serializers.CharField(max_length=100, help_text="The session's id; stored once per stack")
    summary = serializers.CharField(max_length=SUMMARY_MAX, trim_whitespace=False, required=False, allow_blank=True,
                                    help_text="The session's transcript or summary (redacted before anything "
                                              "else); without one the card is made from the other fields")
    timestamp = serializers.CharField(max_length=200, required=False)
    tool_name = serializers.CharField(max_length=200, required=False)
    success = serializers.BooleanField(required=False, allow_null=True, default=None)
    tags = serializers.ListField(child=serializers.CharField(max_length=100), max_length=50, required=False)
    schema_version = serializers.CharField(max_length=200, required=False)
    metadata = serializers.DictField(required=False, help_text=(
        "Stored with the session, except Lumera's control flags: `dry_run`, and `allow_raw_export` with "
        f"`raw_export_ack` = {RAW_EXPORT_PHRASE!r} (docs/algorithms.md §12.4)"))
    dry_run = serializers.BooleanField(default=False, help_text="Return the card and the report; store nothing")
    mode = serializers.ChoiceField(choices=sorted(SESSION_MODES), required=False,
                                   help_text="Lumera's storage backend; accepted, MemoryHub is the store either way")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        known = [*SESSION_FIELDS, "dry_run", "mode"]
        unknown = sorted(set(self.initial_data) - set(known)) if isinstance(self.initial_data, dict) else []
        if unknown:
            fields = {}
            for name in unknown:
                close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
                fields[name] = [f"Unknown field. Did you mean {close[0]!r}?" if close else
                                "Unknown field; a session holds only: " + ", ".join(SESSION_FIELDS) + "."]
            raise InvalidInput("The session has fields that are not stored.", code="unknown_field", fields=fields)
        return attrs


_CARD = inline_serializer("MemoryCard", fields={
    "title": serializers.CharField(), "summary_bullets": serializers.ListField(child=serializers.CharField()),
    "decisions": serializers.ListField(child=serializers.CharField()),
    "todos": serializers.ListField(child=serializers.CharField()),
    "entities": serializers.ListField(child=serializers.CharField()),
    "keywords": serializers.ListField(child=serializers.CharField()),
    "notable_quotes": serializers.ListField(child=serializers.CharField()),
    "tags": serializers.ListField(child=serializers.CharField()),
})


class SessionsView(APIView):
    @extend_schema(
        tags=[TAG], request=SessionSerializer, summary="Store a session as an episode and its memory card",
        responses={201: inline_serializer("SessionStored", fields={
            "episode": MemorySerializer(), "card_memory": MemorySerializer(), "card": _CARD,
            "redaction": serializers.ListField(child=serializers.DictField(), help_text='[{"rule", "count"}]'),
            "stored": serializers.BooleanField(),
            "raw_export": serializers.BooleanField(help_text="The raw-export opt-in was given and acknowledged")}),
            200: inline_serializer("SessionDryRun", fields={
                "session": serializers.DictField(help_text="The allowlisted session, redacted"), "card": _CARD,
                "redaction": serializers.ListField(child=serializers.DictField()),
                "stored": serializers.BooleanField(help_text="false: a dry run stores nothing"),
                "raw_export": serializers.BooleanField()})},
        examples=[OpenApiExample("A tutoring session", request_only=True, value={
            "session_id": "s-42", "tool_name": "tutor", "success": True, "tags": ["math"],
            "summary": "Worked on fractions with Ada. We decided to use pizza diagrams. TODO: send a worksheet."})])
    def post(self, request: Request, stack: str) -> Response:
        principal = principal_of(request)
        author = request_author(request, principal, path=Path.API)  # a bad X-Agent-Id: 400, nothing stored
        target = stack_for_principal(principal, stack, write=True)
        data = validated(SessionSerializer, request.data)
        options = session_options(data)
        prepared = session_prepare(data, stack_policy(target))
        if options.dry_run:
            return Response({"session": prepared.session, "card": prepared.card, "redaction": prepared.redaction,
                             "stored": False, "raw_export": options.raw_export})
        episode, card_memory = session_store(stack=target, prepared=prepared, author=author)
        return Response({"episode": MemorySerializer(episode).data, "card_memory": MemorySerializer(card_memory).data,
                         "card": prepared.card, "redaction": prepared.redaction, "stored": True,
                         "raw_export": options.raw_export}, status=201)


urlpatterns = [
    path("api/v1/stacks/<str:stack>/sessions", SessionsView.as_view(), name="sessions"),
]
