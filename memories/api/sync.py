"""Sync routes: the Kernle protocol at the root and the native cursor API under /api/v1/.

* `POST sync/push`, `POST sync/pull` — docs/kernle-protocol.md §3-§4, exactly what `kernle==0.15.0`
  sends (no trailing slash: the CLI appends paths directly to the backend URL); up to 1,000 operations;
* `POST api/v1/stacks/{stack}/sync/push` — up to 1,000 operations, per-operation results;
* `GET api/v1/stacks/{stack}/sync/pull?cursor=&limit=` — a page of changes after an opaque cursor.

Views only check that the body is an object, call one service in memories.sync and serialize its
result. Unlike the rest of the API (memories.serializers), the serializers below document the wire
shapes but do not read them: memories.sync reads each operation itself, with
memories.records.normalize.normalize_memory for the record. A push carries up to 1,000 operations and
validation is already its largest per-operation cost; a DRF serializer costs over ten times that
(see memories.records.reader), noticeably more for a push of 1,000.
The whole-request checks (a list, at most 1,000 operations, a readable `since`) are the services'.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.http import HttpResponse
from django.urls import URLPattern, URLResolver, path
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.authors import Path, request_author
from accounts.principal import principal_of
from accounts.throttles import SYNC_PULL_THROTTLES, SYNC_PUSH_THROTTLES
from memories import sync
from memories.reads.access_log import AccessPath, record_request_access
from memoryhub.errors import InvalidInput
from memoryhub.lanes import bulk_request, enter_bulk_lane
from memoryhub.limits import SyncPushJSONParser

ERRORS = {
    400: OpenApiResponse(description="Body is not a JSON object, `operations` is not a list, the stack id or "
                                     "`since` is invalid; `detail` says why"),
    401: OpenApiResponse(description="Missing, invalid or expired credential"),
    403: OpenApiResponse(description="Read-only key writing"),
    404: OpenApiResponse(description="Stack not reachable with this credential (e.g. a key bound to another stack)"),
    409: OpenApiResponse(description="Archived stack"),
    429: OpenApiResponse(description="Rate limited; see Retry-After"),
    503: OpenApiResponse(description="Database or rate-limit store unavailable; see Retry-After"),
}
TOO_MANY_OPERATIONS = OpenApiResponse(
    description=f"More than {sync.PUSH_MAX_OPERATIONS:,} operations (`too_many_operations`; the limit is "
                "`error.fields.max_operations`); nothing was stored")


# --- documentation serializers (the wire shapes; parsing is the service's, op by op) -------------------

class KernleOperationSerializer(serializers.Serializer):
    operation = serializers.CharField(help_text="update | insert | upsert (all mean upsert) | delete")
    table = serializers.CharField(help_text="episodes, notes, beliefs, values (alias agent_values), goals, drives, "
                                            "relationships, playbooks, raw_captures")
    record_id = serializers.CharField()
    local_updated_at = serializers.DateTimeField(allow_null=True, required=False)
    version = serializers.IntegerField(required=False)
    data = serializers.DictField(required=False, help_text="The full record; absent on deletes")  # type: ignore[assignment]


class KernlePushRequestSerializer(serializers.Serializer):
    stack_id = serializers.CharField()
    operations = KernleOperationSerializer(many=True, help_text=f"At most {sync.PUSH_MAX_OPERATIONS}")


class KernleAckSerializer(serializers.Serializer):
    table = serializers.CharField(allow_null=True)
    record_id = serializers.CharField(allow_null=True)


class KernleConflictSerializer(KernleAckSerializer):
    operation = serializers.CharField(allow_null=True)
    error = serializers.CharField()


class KernlePushResponseSerializer(serializers.Serializer):
    synced = serializers.IntegerField(help_text="operations minus conflicts")
    conflicts = KernleConflictSerializer(many=True)
    acknowledged_operations = KernleAckSerializer(many=True, help_text="exactly the applied operations, with the "
                                                                       "wire table name the client sent")
    server_time = serializers.DateTimeField()


class KernlePullRequestSerializer(serializers.Serializer):
    stack_id = serializers.CharField()
    since = serializers.DateTimeField(allow_null=True, required=False,
                                      help_text="The client's clock at its last pull; absent or null: everything; "
                                                "anything but an ISO-8601 timestamp: 400 invalid_since")


class KernlePulledOperationSerializer(serializers.Serializer):
    operation = serializers.CharField(help_text="always update")
    table = serializers.CharField()
    record_id = serializers.CharField()
    data = serializers.DictField()  # type: ignore[assignment]
    local_updated_at = serializers.DateTimeField()
    version = serializers.IntegerField()


class KernlePullResponseSerializer(serializers.Serializer):
    operations = KernlePulledOperationSerializer(many=True)
    has_more = serializers.BooleanField(help_text="always false: the change set is complete")
    server_time = serializers.DateTimeField()


class NativeOperationSerializer(serializers.Serializer):
    op = serializers.ChoiceField(choices=["upsert", "delete"], default="upsert")
    kind = serializers.ChoiceField(choices=["raw", "episode", "note", "belief", "value", "goal", "drive",
                                            "relationship", "playbook"])
    record_id = serializers.CharField(max_length=sync.RECORD_ID_MAX)
    updated_at = serializers.DateTimeField(required=False, allow_null=True,
                                           help_text="When the client changed it; the later change wins")
    data = serializers.DictField(required=False, help_text="The record (kernle field names); not for deletes")  # type: ignore[assignment]


class NativePushRequestSerializer(serializers.Serializer):
    operations = NativeOperationSerializer(many=True, help_text=f"At most {sync.PUSH_MAX_OPERATIONS}")


class NativeOpErrorSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()
    fields = serializers.DictField()  # type: ignore[assignment]


class NativeOpResultSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    kind = serializers.CharField(allow_null=True)
    record_id = serializers.CharField(allow_null=True)
    status = serializers.ChoiceField(choices=["applied", "rejected"])
    version = serializers.IntegerField(required=False)
    error = NativeOpErrorSerializer(required=False)


class NativePushResponseSerializer(serializers.Serializer):
    results = NativeOpResultSerializer(many=True)
    applied = serializers.IntegerField()
    rejected = serializers.IntegerField()
    server_time = serializers.DateTimeField()


class NativeChangeSerializer(serializers.Serializer):
    """One change (docs/api.md §5): an upsert carries the record; a tombstone carries ids only."""

    op = serializers.ChoiceField(choices=["upsert", "forget", "delete"],
                                 help_text="upsert: live (created, changed, recovered); forget and delete: a "
                                           "tombstone, ids only — drop the copy with this `id`")
    id = serializers.UUIDField()
    kind = serializers.CharField(allow_null=True, help_text="null for a memory purged or erased (the row is gone)")
    record_id = serializers.CharField(allow_null=True, help_text="null for a memory purged or erased")
    version = serializers.IntegerField(allow_null=True)
    client_version = serializers.IntegerField(allow_null=True)
    created_at = serializers.DateTimeField(allow_null=True)
    updated_at = serializers.DateTimeField(allow_null=True)
    server_updated_at = serializers.DateTimeField()
    forgotten = serializers.BooleanField()
    forgotten_at = serializers.DateTimeField(allow_null=True)
    reason = serializers.ChoiceField(choices=["forgotten", "deleted", "expired", "erased"], allow_null=True,
                                     help_text="Why a tombstone: forgotten, deleted (a sync delete), expired (its "
                                               "TTL or the school's retention), erased; null for an upsert")
    data = serializers.DictField(help_text="The record for an upsert; {} for a tombstone")  # type: ignore[assignment]


class NativePullResponseSerializer(serializers.Serializer):
    changes = NativeChangeSerializer(many=True)
    next_cursor = serializers.CharField(help_text="Pass back as `cursor` to continue exactly after this page")
    has_more = serializers.BooleanField()


@contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Run a push without Python's cyclic garbage collector.

    WHY: a push of 500-1,000 operations allocates ~100,000 short-lived objects (the parsed body,
    normalised records, rows) that live for the whole request. They survive young collections,
    get promoted, and every few requests trigger a FULL collection that walks the whole process
    heap (Django, DRF, Celery...); bench/sync.py's push time falls markedly with this pause alone
    (docs/benchmarks.md "Figures behind code choices"). These objects form no cycles (reference counting frees
    them when the request ends), so the collector has nothing to find here. Process-wide: with two
    pushes in flight, the one that paused collection turns it back on when it ends and the other
    finishes with it; a pause lasts one push (tens of milliseconds), so nothing accumulates.
    """
    was_enabled = gc.isenabled()
    if was_enabled:
        gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _object_body(request: Request) -> dict[str, Any]:
    body = request.data
    if not isinstance(body, dict):
        raise InvalidInput("The body must be a JSON object.", code="invalid_body")
    return body


# --- Kernle protocol ---------------------------------------------------------------------------------------

class KernlePushView(APIView):
    throttle_classes = list(SYNC_PUSH_THROTTLES)
    parser_classes = [SyncPushJSONParser]  # an over-long string is one operation's refusal, not the push's

    @extend_schema(
        operation_id="kernle_sync_push", tags=["kernle sync"], request=KernlePushRequestSerializer,
        responses={200: KernlePushResponseSerializer, 413: TOO_MANY_OPERATIONS, **ERRORS},
        examples=[OpenApiExample("A note and a deletion", request_only=True, value={
            "stack_id": "ada", "operations": [
                {"operation": "upsert", "table": "notes", "record_id": "3f6c2b1e-0d7a-4c55-8e0b-6a1d2c3b4a59",
                 "local_updated_at": "2026-11-24T09:00:00+00:00", "version": 1,
                 "data": {"content": "Fractions click with pizza diagrams", "note_type": "insight",
                          "derived_from": ["raw:0a1b2c3d"]}},
                {"operation": "delete", "table": "beliefs", "record_id": "9e8d7c6b-5a49-4382-9170-a1b2c3d4e5f6"}]})],
        summary="Push local changes (docs/kernle-protocol.md §3): each operation applied on its own, conflicts per "
                "operation, acknowledged only after commit",
    )
    def post(self, request: Request) -> Response:
        with _cyclic_gc_paused():
            principal = principal_of(request)
            if bulk_request(request._request):
                enter_bulk_lane(request._request, principal.organization.pk)
            author = request_author(request, principal, path=Path.KERNLE)  # a bad X-Agent-Id: 400, nothing stored
            body = _object_body(request)
            result = sync.kernle_push(principal=principal, stack_id=body.get("stack_id"),
                                      operations=body.get("operations"), author=author)
        return Response({
            "synced": result.synced,
            "conflicts": result.conflicts,
            "acknowledged_operations": result.acknowledged,
            "server_time": result.server_time.isoformat(),
        })


class KernlePullView(APIView):
    throttle_classes = list(SYNC_PULL_THROTTLES)

    @extend_schema(
        operation_id="kernle_sync_pull", tags=["kernle sync"], request=KernlePullRequestSerializer,
        responses={200: KernlePullResponseSerializer, **ERRORS},
        summary="Pull the complete change set since the client's clock (docs/kernle-protocol.md §4)",
    )
    def post(self, request: Request) -> HttpResponse:
        request_body = _object_body(request)
        principal = principal_of(request)
        if request_body.get("since") is None:  # the whole change set: bulk work
            enter_bulk_lane(request._request, principal.organization.pk)
        result = sync.kernle_pull(principal=principal, stack_id=request_body.get("stack_id"),
                                  since=request_body.get("since"))
        if result.stack_id is not None:
            record_request_access(request, stack_id=result.stack_id, path=AccessPath.PULL, via=Path.KERNLE,
                                  memory_ids=result.memory_ids)
        # The operations arrive as JSON text assembled without decoding any record (a 10,000-record
        # change set would otherwise be decoded and re-encoded); the envelope is added around it.
        body = (f'{{"operations": {result.operations_json}, "has_more": false, '
                f'"server_time": {json.dumps(result.server_time.isoformat())}}}')
        return HttpResponse(body, content_type="application/json")


# --- native API --------------------------------------------------------------------------------------------

class NativePushView(APIView):
    throttle_classes = list(SYNC_PUSH_THROTTLES)
    parser_classes = [SyncPushJSONParser]

    @extend_schema(
        operation_id="stack_sync_push", tags=["sync"], request=NativePushRequestSerializer,
        responses={200: NativePushResponseSerializer,
                   402: OpenApiResponse(description="Storage quota exceeded; `error.fields.limit` names the limit "
                                                    "and nothing was stored"),
                   413: TOO_MANY_OPERATIONS, **ERRORS},
        examples=[OpenApiExample("Upsert a note, delete a belief", request_only=True, value={"operations": [
            {"op": "upsert", "kind": "note", "record_id": "n-1", "updated_at": "2026-11-24T09:00:00+00:00",
             "data": {"content": "Fractions click with pizza diagrams", "tags": ["math"]}},
            {"op": "delete", "kind": "belief", "record_id": "b-7"}]})],
        summary="Push up to 1,000 operations to a stack, applied in order, one result per operation",
    )
    def post(self, request: Request, stack: str) -> Response:
        with _cyclic_gc_paused():
            principal = principal_of(request)
            if bulk_request(request._request):
                enter_bulk_lane(request._request, principal.organization.pk)
            author = request_author(request, principal, path=Path.API)  # a bad X-Agent-Id: 400, nothing stored
            body = _object_body(request)
            result = sync.native_push(principal=principal, stack_slug=stack, operations=body.get("operations"),
                                      author=author)
        return Response({"results": result.results, "applied": result.applied, "rejected": result.rejected,
                         "server_time": result.server_time.isoformat()})


class NativePullView(APIView):
    # Paging is the point of this endpoint (a device catching up on 100,000 changes makes 100
    # requests), so it keeps the default per-credential request rate instead of the kernle
    # pull's 60/min.

    @extend_schema(
        operation_id="stack_sync_pull", tags=["sync"],
        parameters=[
            OpenApiParameter("cursor", str, description="next_cursor of the previous page; absent: from the start"),
            OpenApiParameter("limit", int, description=f"Page size, 1-{sync.NATIVE_PAGE_MAX} "
                                                       f"(default {sync.NATIVE_PAGE_DEFAULT})"),
        ],
        responses={200: NativePullResponseSerializer, **ERRORS},
        summary="A page of a stack's changes after a cursor, oldest first (deletions as tombstones)",
    )
    def get(self, request: Request, stack: str) -> HttpResponse:
        result = sync.native_pull(principal=principal_of(request), stack_slug=stack,
                                  cursor=request.query_params.get("cursor"),
                                  limit=request.query_params.get("limit"))
        record_request_access(request, stack_id=result.stack_id, path=AccessPath.PULL, memory_ids=result.memory_ids)
        body = (f'{{"changes": {result.changes_json}, "next_cursor": {json.dumps(result.next_cursor)}, '
                f'"has_more": {json.dumps(result.has_more)}}}')
        return HttpResponse(body, content_type="application/json")


urlpatterns: list[URLPattern | URLResolver] = [
    path("sync/push", KernlePushView.as_view(), name="kernle-sync-push"),
    path("sync/pull", KernlePullView.as_view(), name="kernle-sync-pull"),
    path("api/v1/stacks/<str:stack>/sync/push", NativePushView.as_view(), name="stack-sync-push"),
    path("api/v1/stacks/<str:stack>/sync/pull", NativePullView.as_view(), name="stack-sync-pull"),
]
