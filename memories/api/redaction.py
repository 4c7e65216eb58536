"""POST /api/v1/stacks/<stack>/redaction/preview: a dry run of redaction (docs/algorithms.md §11).

The body is a memory as for create; the answer is what a create would store (redacted text and
fields, the report) — or the same 4xx a create would get (422 `redaction_refused` for a CRITICAL
secret). Nothing is stored. The stack's school's PII categories apply, as on a create. The same
access decision as a create (write access to the stack), so a
preview cannot probe a stack the caller could not write to.
"""

from __future__ import annotations

from django.urls import path
from drf_spectacular.utils import OpenApiExample, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.principal import principal_of
from memories.privacy.redaction.engine import redaction_preview
from memories.privacy.redaction.policy import stack_policy
from memories.serializers import validated
from memories.serializers.records import MemoryWriteSerializer
from stacks.selectors import stack_for_principal

_PREVIEW = inline_serializer("RedactionPreview", fields={
    "kind": serializers.CharField(),
    "text": serializers.CharField(help_text="The canonical text as it would be stored and indexed"),
    "data": serializers.DictField(),
    "extra": serializers.DictField(),
    "tags": serializers.ListField(child=serializers.CharField()),
    "redaction": serializers.ListField(child=serializers.DictField(), help_text='[{"rule", "count"}]'),
    "stored": serializers.BooleanField(help_text="Always false: a preview stores nothing"),
})


class RedactionPreviewView(APIView):
    @extend_schema(tags=["memories"], request=MemoryWriteSerializer, responses={200: _PREVIEW},
                   examples=[OpenApiExample("A note with an email", request_only=True, value={
                       "kind": "note", "content": "Ada's mother: ada.mum@example.org"})],
                   summary="Dry-run redaction of a memory (stores nothing)")
    def post(self, request: Request, stack: str) -> Response:
        target = stack_for_principal(principal_of(request), stack, write=True)
        data = validated(MemoryWriteSerializer, request.data)
        return Response(redaction_preview(data["kind"], data["record"], stack_policy(target)))


urlpatterns = [
    path("api/v1/stacks/<str:stack>/redaction/preview", RedactionPreviewView.as_view(), name="redaction-preview"),
]
