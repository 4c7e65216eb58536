"""Native memory API under /api/v1/stacks/<stack>/…: memories, checkpoint, boot config, load,
MEMORY.md export and promotion.

Thin views: resolve the stack through `stack_for_principal` (write=True for writes), read the body
or query string with its request serializer (memories.serializers), call one service or selector,
serialize. Every rule lives in memories.records / services / selectors / load / export / promotion.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.http import HttpResponse
from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.authors import Author, Path, request_author
from accounts.principal import principal_of
from memories import selectors, services
from memories.lifecycle.promotion import promote_lessons
from memories.models import Memory
from memories.privacy import originals
from memories.privacy.grants import Audience, audience_for
from memories.reads.access_log import AccessPath, record_request_access
from memories.reads.export import stack_memory_md
from memories.reads.load import MAX_ITEM_CHARS, stack_load
from memories.records.cleaning import clean_json
from memories.serializers import validated
from memories.serializers.memories import (
    BootConfigEntrySerializer,
    BootConfigValueSerializer,
    CheckpointInSerializer,
    CheckpointSerializer,
    ForgetSerializer,
    LoadQuerySerializer,
    LoadResultSerializer,
    MemoryBatchResultSerializer,
    MemoryDetailSerializer,
    MemoryListQuerySerializer,
    MemorySerializer,
    PromoteInSerializer,
    PromotionResultSerializer,
)
from memories.serializers.records import MemoryBatchSerializer, MemoryUpdateSerializer, MemoryWriteSerializer
from memoryhub.errors import NotFound
from memoryhub.pagination import StableCursorPagination
from memoryhub.renderers import FastJSONRenderer
from stacks.models import Stack
from stacks.selectors import stack_for_principal

TAG = "memories"


def _stack(request: Request, slug: str, *, write: bool = False) -> Stack:
    return stack_for_principal(principal_of(request), slug, write=write)


def _reach(request: Request, slug: str, *, write: bool = False) -> tuple[Stack, Audience | None]:
    """The stack, and the caller's privacy-grants audience on it (None: the stack's own credentials)."""
    principal = principal_of(request)
    target = stack_for_principal(principal, slug, write=write)
    return target, audience_for(principal, stack_id=target.pk)


def _author(request: Request) -> Author:
    """Who writes (docs/privacy.md "Provenance"): the credential, the `X-Agent-Id` label and the
    native path. Read before anything else, so a bad label is a 400 and nothing is stored."""
    return request_author(request, principal_of(request), path=Path.API)


def _memory(request: Request, slug: str, memory_id: str, *, write: bool = False) -> Memory:
    """A memory the caller may see (hidden by its grants: 404, like a missing one)."""
    target, audience = _reach(request, slug, write=write)
    return selectors.memory_get(stack=target, memory_id=memory_id, audience=audience)


PAGE_PARAMS = [
    OpenApiParameter("cursor", OpenApiTypes.STR, description="`next` of the previous page"),
    OpenApiParameter("limit", OpenApiTypes.INT, description="Page size"),
]


class MemoryListView(APIView):
    @extend_schema(tags=[TAG], parameters=[MemoryListQuerySerializer, *PAGE_PARAMS],
                   responses=MemorySerializer(many=True), summary="List memories (cursor-paginated, newest first)")
    def get(self, request: Request, stack: str) -> Response:
        target, audience = _reach(request, stack)
        filters = validated(MemoryListQuerySerializer, request.query_params)
        queryset = selectors.memories_list(
            stack=target, kinds=filters.get("kind") or None, tags=filters.get("tags") or None,
            created_after=filters.get("created_after"), created_before=filters.get("created_before"),
            forgotten=filters["forgotten"], audience=audience)
        paginator = StableCursorPagination()
        page = paginator.paginate_queryset(queryset, request, view=self)
        record_request_access(request, stack_id=target.pk, path=AccessPath.LIST,
                              memory_ids=[memory.pk for memory in page or ()])
        return paginator.get_paginated_response(MemorySerializer(page, many=True).data)

    @extend_schema(tags=[TAG], request=MemoryWriteSerializer, responses={201: MemorySerializer},
                   examples=[
                       OpenApiExample("A note", request_only=True, value={
                           "kind": "note", "content": "Fractions click with pizza diagrams", "tags": ["math"]}),
                       OpenApiExample("A belief", request_only=True, value={
                           "kind": "belief", "record_id": "b-42", "statement": "Pictures help with fractions",
                           "confidence": 0.9, "tags": ["math"]}),
                       OpenApiExample("A goal with a field of your own", request_only=True, value={
                           "kind": "goal", "title": "Master fractions", "priority": "high",
                           "extra": {"term": "spring"}}),
                       OpenApiExample("A typo: 400 unknown_field", response_only=True, status_codes=["400"], value={
                           "error": {"code": "unknown_field",
                                     "message": "The memory has fields its kind does not know.",
                                     "fields": {"priorty": ["Unknown field. Did you mean 'priority'?"]}},
                           "detail": "The memory has fields its kind does not know."}),
                   ],
                   summary="Create a memory (kind + the kind's fields, flat)")
    def post(self, request: Request, stack: str) -> Response:
        principal = principal_of(request)
        author = _author(request)
        data = validated(MemoryWriteSerializer, request.data)
        memory = services.memory_create_for(principal=principal, stack_slug=stack, kind=data["kind"],
                                            payload=data["record"], source="api", record_id=data.get("record_id"),
                                            author=author)
        return Response(MemorySerializer(memory).data, status=status.HTTP_201_CREATED)


class MemoryBatchView(APIView):
    @extend_schema(tags=[TAG], request=MemoryBatchSerializer, responses={201: MemoryBatchResultSerializer},
                   examples=[OpenApiExample("Two memories", request_only=True, value={"items": [
                       {"kind": "note", "content": "Fractions click with pizza diagrams"},
                       {"kind": "episode", "objective": "Practise fractions", "outcome": "Solved 8 of 10",
                        "lessons": ["Draw the pie first"]}]})],
                   summary="Create many memories, all or nothing")
    def post(self, request: Request, stack: str) -> Response:
        author = _author(request)
        target = _stack(request, stack, write=True)
        items = validated(MemoryBatchSerializer, request.data)["items"]
        memories = services.memory_batch_create(stack=target, items=items, source="api", author=author)
        return Response({"created": len(memories), "memories": MemorySerializer(memories, many=True).data},
                        status=status.HTTP_201_CREATED)


class MemoryDetailView(APIView):
    @extend_schema(tags=[TAG], responses=MemoryDetailSerializer,
                   summary="Read a memory, with who wrote it and its newest changes and their authors")
    def get(self, request: Request, stack: str, memory_id: str) -> Response:
        memory = _memory(request, stack, memory_id)
        record_request_access(request, stack_id=memory.stack_id, path=AccessPath.GET, memory_ids=[memory.pk])
        return Response(MemoryDetailSerializer(memory).data)

    @extend_schema(tags=[TAG], request=MemoryUpdateSerializer, responses=MemorySerializer,
                   examples=[OpenApiExample("New wording and tags", request_only=True, value={
                       "statement": "Pictures help a lot", "tags": ["math", "visual"]})],
                   summary="Update a memory (partial; null resets a field)")
    def patch(self, request: Request, stack: str, memory_id: str) -> Response:
        author = _author(request)
        memory = _memory(request, stack, memory_id, write=True)
        record = validated(MemoryUpdateSerializer, request.data, context={"kind": memory.kind})["record"]
        memory = services.memory_update(memory=memory, payload=record, source="api", author=author)
        return Response(MemorySerializer(memory).data)


class RawOriginalSerializer(serializers.Serializer):
    text = serializers.CharField(help_text="The raw entry's text as submitted, before redaction")
    key_id = serializers.CharField(help_text="Id of the key it is sealed with (MEMORYHUB_ENCRYPTION_KEYS)")
    sealed_at = serializers.DateTimeField()


class MemoryOriginalView(APIView):
    @extend_schema(tags=[TAG], responses={
        200: RawOriginalSerializer,
        404: OpenApiResponse(description="No original kept (the school did not opt in, redaction changed "
                                         "nothing, not a raw entry), or the caller is neither the stack's own "
                                         "credentials nor a school admin: `original_not_found`"),
        503: OpenApiResponse(description="The kept original cannot be opened (its key is not configured, or "
                                         "wrong key or tampered data): `original_unreadable`")},
        summary="A raw entry's original (unredacted) text, if the school keeps it (audited)")
    def get(self, request: Request, stack: str, memory_id: str) -> Response:
        memory = _memory(request, stack, memory_id)
        kept = originals.raw_original_text(principal_of(request), memory)
        record_request_access(request, stack_id=memory.stack_id, path=AccessPath.GET, memory_ids=[memory.pk])
        response = Response(RawOriginalSerializer(kept).data)
        response["Cache-Control"] = "private, no-store"
        return response


class MemoryForgetView(APIView):
    @extend_schema(tags=[TAG], request=ForgetSerializer, responses=MemorySerializer,
                   summary="Forget a memory (reversible tombstone)")
    def post(self, request: Request, stack: str, memory_id: str) -> Response:
        author = _author(request)
        memory = _memory(request, stack, memory_id, write=True)
        reason = validated(ForgetSerializer, clean_json(request.data))["reason"]  # null bytes removed, not refused
        return Response(MemorySerializer(services.memory_forget(memory=memory, reason=reason, author=author)).data)


class MemoryRecoverView(APIView):
    @extend_schema(tags=[TAG], request=None, responses=MemorySerializer, summary="Recover a forgotten memory")
    def post(self, request: Request, stack: str, memory_id: str) -> Response:
        author = _author(request)
        memory = _memory(request, stack, memory_id, write=True)
        return Response(MemorySerializer(services.memory_recover(memory=memory, author=author)).data)


class MemoryProtectView(APIView):
    protected = True

    @extend_schema(tags=[TAG], request=None, responses=MemorySerializer,
                   summary="Protect / unprotect a memory from decay and forgetting")
    def post(self, request: Request, stack: str, memory_id: str) -> Response:
        author = _author(request)
        memory = _memory(request, stack, memory_id, write=True)
        memory = services.memory_set_protected(memory=memory, protected=self.protected, author=author)
        return Response(MemorySerializer(memory).data)


class MemoryUnprotectView(MemoryProtectView):
    protected = False


# --- checkpoint ------------------------------------------------------------------------------------

class CheckpointView(APIView):
    @extend_schema(tags=[TAG], responses={200: CheckpointSerializer, 404: OpenApiResponse(description="None saved")},
                   summary="The latest checkpoint, with warnings when stale or generic")
    def get(self, request: Request, stack: str) -> Response:
        checkpoint = selectors.checkpoint_latest(stack=_stack(request, stack))
        if checkpoint is None:
            raise NotFound("No checkpoint saved yet.", code="no_checkpoint")
        return Response(CheckpointSerializer(checkpoint).data)

    @extend_schema(tags=[TAG], request=CheckpointInSerializer, responses={201: CheckpointSerializer},
                   summary="Save a checkpoint")
    def post(self, request: Request, stack: str) -> Response:
        target = _stack(request, stack, write=True)
        data = validated(CheckpointInSerializer, clean_json(request.data))  # null bytes removed, not refused
        checkpoint = services.checkpoint_save(stack=target, checkpoint=services.CheckpointInput(
            task=data["task"], progress=data.get("progress") or "", next_step=data.get("next_step") or "",
            blocker=data.get("blocker") or "", context=data["context"], pending=data["pending"],
        ))
        return Response(CheckpointSerializer(checkpoint).data, status=status.HTTP_201_CREATED)

    @extend_schema(tags=[TAG], request=CheckpointInSerializer, responses={201: CheckpointSerializer},
                   summary="Save a checkpoint (the same as POST: a new checkpoint, history kept)")
    def put(self, request: Request, stack: str) -> Response:
        return self.post(request, stack)


class CheckpointHistoryView(APIView):
    @extend_schema(tags=[TAG], parameters=PAGE_PARAMS, responses=CheckpointSerializer(many=True),
                   summary="Checkpoint history, newest first")
    def get(self, request: Request, stack: str) -> Response:
        queryset = selectors.checkpoint_history(stack=_stack(request, stack))
        paginator = StableCursorPagination()
        page = paginator.paginate_queryset(queryset, request, view=self)
        return paginator.get_paginated_response(CheckpointSerializer(page, many=True).data)


# --- boot config -----------------------------------------------------------------------------------

class BootConfigListView(APIView):
    @extend_schema(tags=[TAG], responses=BootConfigEntrySerializer(many=True), summary="List boot config")
    def get(self, request: Request, stack: str) -> Response:
        entries = selectors.boot_config_entries(stack=_stack(request, stack))
        return Response(BootConfigEntrySerializer(entries, many=True).data)


class BootConfigDetailView(APIView):
    @extend_schema(tags=[TAG], responses=BootConfigEntrySerializer, summary="Read one boot config key")
    def get(self, request: Request, stack: str, key: str) -> Response:
        entry = selectors.boot_config_get(stack=_stack(request, stack), key=key)
        return Response(BootConfigEntrySerializer(entry).data)

    @extend_schema(tags=[TAG], request=BootConfigValueSerializer, responses=BootConfigEntrySerializer,
                   summary="Set one boot config key")
    def put(self, request: Request, stack: str, key: str) -> Response:
        target = _stack(request, stack, write=True)
        value = validated(BootConfigValueSerializer, clean_json(request.data))["value"]
        entry = services.boot_config_set(stack=target, key=key, value=value)
        return Response(BootConfigEntrySerializer(entry).data)

    @extend_schema(tags=[TAG], responses={204: None}, summary="Delete one boot config key")
    def delete(self, request: Request, stack: str, key: str) -> Response:
        services.boot_config_delete(stack=_stack(request, stack, write=True), key=key)
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- load, export, promotion ---------------------------------------------------------------------

class LoadView(APIView):
    @extend_schema(tags=[TAG], parameters=[LoadQuerySerializer], responses=LoadResultSerializer,
                   examples=[OpenApiExample("A small load", response_only=True, value={
                       "checkpoint": None, "boot_config": {"tone": "encouraging"},
                       "memories": [{"id": "5b0c1f4e-8a51-4c43-9a55-2f1c3f0b6a11", "kind": "value",
                                     "record_id": "5b0c1f4e-8a51-4c43-9a55-2f1c3f0b6a11",
                                     "text": "curiosity\nAsk why before how", "score": 0.91, "tokens": 9,
                                     "truncated": False, "created_at": "2026-11-24T09:00:00+00:00",
                                     "details": {"name": "curiosity", "priority": 80}}],
                       "echoes": [], "meta": {"budget_total": 8000, "budget_used": 31, "excluded_count": 0,
                                              "item_chars": 500},
                       "generated_at": "2026-11-24T09:30:00+00:00"})],
                   summary="Budget-aware load: checkpoint, boot config, then memories by priority")
    def get(self, request: Request, stack: str) -> Response:
        target, audience = _reach(request, stack)
        query = validated(LoadQuerySerializer, request.query_params)
        item_chars = MAX_ITEM_CHARS if query.get("no_truncate") else query.get("item_chars")
        result = stack_load(stack=target, budget=query.get("budget"), item_chars=item_chars, audience=audience)
        record_request_access(request, stack_id=target.pk, path=AccessPath.LOAD, memory_ids=result.served_ids())
        return Response(result.as_json())


class MarkdownRenderer(BaseRenderer):
    """Lets clients ask for `Accept: text/markdown`; errors still come out as JSON text."""

    media_type = "text/markdown"
    format = "md"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        if isinstance(data, str):
            return data.encode()
        return FastJSONRenderer().render(data)


class ExportMemoryMdView(APIView):
    renderer_classes = [FastJSONRenderer, MarkdownRenderer]

    @extend_schema(tags=[TAG], responses={(200, "text/markdown"): OpenApiTypes.STR},
                   summary="MEMORY.md for the stack (text/markdown)")
    def get(self, request: Request, stack: str) -> HttpResponse:
        target, audience = _reach(request, stack)
        served: list[uuid.UUID] = []
        body = stack_memory_md(stack=target, audience=audience, served=served)
        record_request_access(request, stack_id=target.pk, path=AccessPath.MEMORY_MD, memory_ids=served)
        response = HttpResponse(body, content_type="text/markdown; charset=utf-8")
        response["Content-Disposition"] = 'inline; filename="MEMORY.md"'
        response["Cache-Control"] = "private, no-store"
        return response


class PromoteView(APIView):
    @extend_schema(tags=[TAG], request=PromoteInSerializer, responses=PromotionResultSerializer,
                   summary="Promote recurring episode lessons to beliefs (suggest, or create with auto)")
    def post(self, request: Request, stack: str) -> Response:
        author = _author(request)
        target, audience = _reach(request, stack)
        data = validated(PromoteInSerializer, request.data)
        selectors.ensure_may_promote(principal_of(request), target, auto=data["auto"])
        # Only the episodes (and beliefs) the caller's grants admit are read: no hidden lesson comes back.
        result = promote_lessons(stack=target, auto=data["auto"], limit=data["limit"], source="api",
                                 audience=audience, author=author)
        return Response(result.as_dict())


_BASE = "api/v1/stacks/<str:stack>/"

urlpatterns = [
    path(_BASE + "memories", MemoryListView.as_view(), name="memory-list"),
    path(_BASE + "memories/batch", MemoryBatchView.as_view(), name="memory-batch"),
    path(_BASE + "memories/<uuid:memory_id>", MemoryDetailView.as_view(), name="memory-detail"),
    path(_BASE + "memories/<uuid:memory_id>/original", MemoryOriginalView.as_view(), name="memory-original"),
    path(_BASE + "memories/<uuid:memory_id>/forget", MemoryForgetView.as_view(), name="memory-forget"),
    path(_BASE + "memories/<uuid:memory_id>/recover", MemoryRecoverView.as_view(), name="memory-recover"),
    path(_BASE + "memories/<uuid:memory_id>/protect", MemoryProtectView.as_view(), name="memory-protect"),
    path(_BASE + "memories/<uuid:memory_id>/unprotect", MemoryUnprotectView.as_view(), name="memory-unprotect"),
    path(_BASE + "checkpoint", CheckpointView.as_view(), name="checkpoint"),
    path(_BASE + "checkpoint/history", CheckpointHistoryView.as_view(), name="checkpoint-history"),
    path(_BASE + "boot-config", BootConfigListView.as_view(), name="boot-config-list"),
    path(_BASE + "boot-config/<str:key>", BootConfigDetailView.as_view(), name="boot-config-detail"),
    path(_BASE + "load", LoadView.as_view(), name="stack-load"),
    path(_BASE + "export/memory.md", ExportMemoryMdView.as_view(), name="stack-export-memory-md"),
    path(_BASE + "promote", PromoteView.as_view(), name="stack-promote"),
]
