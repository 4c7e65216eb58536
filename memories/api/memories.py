"""Native memory API under /api/v1/stacks/<stack>/…: memories, checkpoint, boot config, load,
MEMORY.md export and promotion.

Thin views: resolve the stack through `stack_for_principal` (write=True for writes), call one
service or selector, serialize. Every rule lives in memories.schemas / services / selectors /
load / export / promotion.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from memories import selectors, services
from memories.export import stack_memory_md
from memories.lifecycle.promotion import promote_lessons
from memories.load import MAX_ITEM_CHARS, stack_load
from memories.models import MemoryKind
from memories.schemas import clean_json, parse_timestamp
from memories.serializers import (
    BootConfigEntrySerializer,
    BootConfigValueSerializer,
    CheckpointInSerializer,
    CheckpointSerializer,
    ForgetSerializer,
    LoadQuerySerializer,
    LoadResultSerializer,
    MemoryBatchResultSerializer,
    MemoryBatchSerializer,
    MemorySerializer,
    MemoryUpdateSerializer,
    MemoryWriteSerializer,
    PromoteInSerializer,
    PromotionResultSerializer,
)
from memoryhub.errors import InvalidInput, NotFound
from memoryhub.pagination import StableCursorPagination
from stacks.models import Stack
from stacks.selectors import ensure_writable, stack_for_principal

TAG = "memories"


def _stack(request: Request, slug: str, *, write: bool = False) -> Stack:
    return stack_for_principal(request.auth, slug, write=write)  # type: ignore[arg-type]


def _body(request: Request) -> dict[str, Any]:
    try:
        data = request.data
    except RecursionError as exc:  # json's C parser gives up on absurd nesting: bad input, not a 500
        raise InvalidInput("The body is nested too deeply.", code="parse_error") from exc
    if not isinstance(data, dict):
        raise InvalidInput("The body must be a JSON object.", fields={"non_field_errors": ["Expected an object."]})
    return dict(data)


def _validated(serializer_class: type[serializers.Serializer], data: Any) -> dict[str, Any]:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


def _memory_list_filters(request: Request) -> dict[str, Any]:
    params = request.query_params
    errors: dict[str, list[str]] = {}
    kinds = [k for value in params.getlist("kind") for k in value.split(",") if k]
    bad = [k for k in kinds if k not in MemoryKind.values]
    if bad:
        errors["kind"] = [f"Unknown kind(s): {', '.join(bad)}."]
    tags = [t for value in params.getlist("tags") for t in value.split(",") if t]
    times = {}
    for name in ("created_after", "created_before"):
        raw = params.get(name)
        if raw:
            times[name] = parse_timestamp(raw)
            if times[name] is None:
                errors[name] = ["Must be an ISO-8601 date-time."]
    forgotten = params.get("forgotten", "exclude")
    if forgotten not in ("exclude", "include", "only"):
        errors["forgotten"] = ["Must be exclude, include or only."]
    if errors:
        raise InvalidInput("Invalid filters.", fields=errors)
    return {"kinds": kinds or None, "tags": tags or None, "forgotten": forgotten, **times}


STACK_PARAM = OpenApiParameter("stack", OpenApiTypes.STR, OpenApiParameter.PATH, description="Stack slug")
LIST_PARAMS = [
    OpenApiParameter("kind", OpenApiTypes.STR, description="Comma-separated kinds"),
    OpenApiParameter("tags", OpenApiTypes.STR, description="Comma-separated tags (all must match)"),
    OpenApiParameter("created_after", OpenApiTypes.DATETIME),
    OpenApiParameter("created_before", OpenApiTypes.DATETIME),
    OpenApiParameter("forgotten", OpenApiTypes.STR, enum=["exclude", "include", "only"]),
    OpenApiParameter("cursor", OpenApiTypes.STR),
    OpenApiParameter("limit", OpenApiTypes.INT),
]


class MemoryListView(APIView):
    @extend_schema(tags=[TAG], parameters=LIST_PARAMS, responses=MemorySerializer(many=True),
                   summary="List memories (cursor-paginated, newest first)")
    def get(self, request: Request, stack: str) -> Response:
        target = _stack(request, stack)
        queryset = selectors.memories_list(stack=target, **_memory_list_filters(request))
        paginator = StableCursorPagination()
        page = paginator.paginate_queryset(queryset, request, view=self)
        return paginator.get_paginated_response(MemorySerializer(page, many=True).data)

    @extend_schema(tags=[TAG], request=MemoryWriteSerializer, responses={201: MemorySerializer},
                   summary="Create a memory (kind + the kind's fields, flat)")
    def post(self, request: Request, stack: str) -> Response:
        target = _stack(request, stack, write=True)
        body = _body(request)
        kind = body.pop("kind", None)
        if not isinstance(kind, str):
            raise InvalidInput("The memory kind is required.", fields={"kind": ["This field is required."]})
        record_id = body.pop("record_id", None)
        memory = services.memory_create(stack=target, kind=kind, payload=body, source="api", record_id=record_id)
        return Response(MemorySerializer(memory).data, status=status.HTTP_201_CREATED)


class MemoryBatchView(APIView):
    @extend_schema(tags=[TAG], request=MemoryBatchSerializer, responses={201: MemoryBatchResultSerializer},
                   summary="Create many memories, all or nothing")
    def post(self, request: Request, stack: str) -> Response:
        target = _stack(request, stack, write=True)
        items = _body(request).get("items")
        memories = services.memory_batch_create(stack=target, items=items, source="api")  # type: ignore[arg-type]
        return Response({"created": len(memories), "memories": MemorySerializer(memories, many=True).data},
                        status=status.HTTP_201_CREATED)


class MemoryDetailView(APIView):
    @extend_schema(tags=[TAG], responses=MemorySerializer, summary="Read a memory")
    def get(self, request: Request, stack: str, memory_id: str) -> Response:
        memory = selectors.memory_get(stack=_stack(request, stack), memory_id=memory_id)
        return Response(MemorySerializer(memory).data)

    @extend_schema(tags=[TAG], request=MemoryUpdateSerializer, responses=MemorySerializer,
                   summary="Update a memory (partial; null resets a field)")
    def patch(self, request: Request, stack: str, memory_id: str) -> Response:
        memory = selectors.memory_get(stack=_stack(request, stack, write=True), memory_id=memory_id)
        body = _body(request)
        memory = services.memory_update(memory=memory, payload=body, source="api")
        return Response(MemorySerializer(memory).data)


class MemoryForgetView(APIView):
    @extend_schema(tags=[TAG], request=ForgetSerializer, responses=MemorySerializer,
                   summary="Forget a memory (reversible tombstone)")
    def post(self, request: Request, stack: str, memory_id: str) -> Response:
        memory = selectors.memory_get(stack=_stack(request, stack, write=True), memory_id=memory_id)
        reason = _validated(ForgetSerializer, clean_json(_body(request)))["reason"]
        return Response(MemorySerializer(services.memory_forget(memory=memory, reason=reason)).data)


class MemoryRecoverView(APIView):
    @extend_schema(tags=[TAG], request=None, responses=MemorySerializer, summary="Recover a forgotten memory")
    def post(self, request: Request, stack: str, memory_id: str) -> Response:
        memory = selectors.memory_get(stack=_stack(request, stack, write=True), memory_id=memory_id)
        return Response(MemorySerializer(services.memory_recover(memory=memory)).data)


class MemoryProtectView(APIView):
    protected = True

    @extend_schema(tags=[TAG], request=None, responses=MemorySerializer,
                   summary="Protect / unprotect a memory from decay and forgetting")
    def post(self, request: Request, stack: str, memory_id: str) -> Response:
        memory = selectors.memory_get(stack=_stack(request, stack, write=True), memory_id=memory_id)
        memory = services.memory_set_protected(memory=memory, protected=self.protected)
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
        data = _validated(CheckpointInSerializer, clean_json(_body(request)))  # null bytes removed, not refused
        checkpoint = services.checkpoint_save(stack=target, checkpoint=services.CheckpointInput(
            task=data["task"], progress=data.get("progress") or "", next_step=data.get("next_step") or "",
            blocker=data.get("blocker") or "", context=data.get("context") or {},
        ))
        return Response(CheckpointSerializer(checkpoint).data, status=status.HTTP_201_CREATED)


class CheckpointHistoryView(APIView):
    @extend_schema(tags=[TAG], parameters=[OpenApiParameter("cursor", OpenApiTypes.STR),
                                           OpenApiParameter("limit", OpenApiTypes.INT)],
                   responses=CheckpointSerializer(many=True), summary="Checkpoint history, newest first")
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
        value = _validated(BootConfigValueSerializer, clean_json(_body(request)))["value"]
        entry = services.boot_config_set(stack=target, key=key, value=value)
        return Response(BootConfigEntrySerializer(entry).data)

    @extend_schema(tags=[TAG], responses={204: None}, summary="Delete one boot config key")
    def delete(self, request: Request, stack: str, key: str) -> Response:
        services.boot_config_delete(stack=_stack(request, stack, write=True), key=key)
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- load, export, promotion ---------------------------------------------------------------------

class LoadView(APIView):
    @extend_schema(tags=[TAG], parameters=[LoadQuerySerializer], responses=LoadResultSerializer,
                   summary="Budget-aware load: checkpoint, boot config, then memories by priority")
    def get(self, request: Request, stack: str) -> Response:
        target = _stack(request, stack)
        query = _validated(LoadQuerySerializer, request.query_params)
        item_chars = MAX_ITEM_CHARS if query.get("no_truncate") else query.get("item_chars")
        result = stack_load(stack=target, budget=query.get("budget"), item_chars=item_chars)
        return Response({
            "checkpoint": result.checkpoint,
            "boot_config": result.boot_config,
            "memories": [item.__dict__ for item in result.memories],
            "echoes": result.echoes,
            "meta": {"budget_total": result.budget_total, "budget_used": result.budget_used,
                     "excluded_count": result.excluded_count, "item_chars": result.item_chars},
            "generated_at": result.generated_at,
        })


class MarkdownRenderer(BaseRenderer):
    """Lets clients ask for `Accept: text/markdown`; errors still come out as JSON text."""

    media_type = "text/markdown"
    format = "md"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        if isinstance(data, str):
            return data.encode()
        return JSONRenderer().render(data)


class ExportMemoryMdView(APIView):
    renderer_classes = [JSONRenderer, MarkdownRenderer]

    @extend_schema(tags=[TAG], responses={(200, "text/markdown"): OpenApiTypes.STR},
                   summary="MEMORY.md for the stack (text/markdown)")
    def get(self, request: Request, stack: str) -> HttpResponse:
        target = _stack(request, stack)
        body = stack_memory_md(stack=target)
        response = HttpResponse(body, content_type="text/markdown; charset=utf-8")
        response["Content-Disposition"] = 'inline; filename="MEMORY.md"'
        response["Cache-Control"] = "private, no-store"
        return response


class PromoteView(APIView):
    @extend_schema(tags=[TAG], request=PromoteInSerializer, responses=PromotionResultSerializer,
                   summary="Promote recurring episode lessons to beliefs (suggest, or create with auto)")
    def post(self, request: Request, stack: str) -> Response:
        target = _stack(request, stack)
        data = _validated(PromoteInSerializer, _body(request))
        if data["auto"]:  # suggestions only read; creating beliefs is a write
            ensure_writable(request.auth, target)  # type: ignore[arg-type]
        result = promote_lessons(stack=target, auto=data["auto"], limit=data["limit"], source="api")
        return Response(result.as_dict())


_BASE = "api/v1/stacks/<str:stack>/"

urlpatterns = [
    path(_BASE + "memories", MemoryListView.as_view(), name="memory-list"),
    path(_BASE + "memories/batch", MemoryBatchView.as_view(), name="memory-batch"),
    path(_BASE + "memories/<uuid:memory_id>", MemoryDetailView.as_view(), name="memory-detail"),
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
