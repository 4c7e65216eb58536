"""Routes for access requests and retention: a stack's portable archive, streamed, and a
school's retention policy per memory kind."""

from __future__ import annotations

from django.http import StreamingHttpResponse
from django.urls import path
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.network import client_ip
from accounts.principal import principal_of
from accounts.selectors import ensure_may_manage_organization
from accounts.services import audit_record
from memories.governance.archive import (
    ARCHIVE_FORMAT_VERSION,
    archive_chunks,
    archive_filename,
    archive_memory_ids,
)
from memories.lifecycle.ttl import retention_of, retention_set
from memories.models import MemoryKind
from memories.privacy.grants import audience_for
from memories.reads.access_history import may_read_access_log
from memories.reads.access_log import AccessPath, record_request_access
from memoryhub.lanes import enter_bulk_lane, release_when_streamed
from memoryhub.streaming import streamed_content
from stacks.selectors import stack_for_principal

TAG = "privacy"



class StackArchiveView(APIView):
    @extend_schema(
        tags=[TAG], summary="The stack's portable archive (ZIP, streamed)",
        description=(f"Everything stored about one stack (format version {ARCHIVE_FORMAT_VERSION}): JSON Lines per "
                     "memory kind with every field, the revision history, checkpoints, boot config, MEMORY.md, "
                     "the access log (for school admins and the stack's own credentials) and "
                     "a README.md describing the format. Anyone who may read the stack may export it (its own "
                     "agent keys included); every export is recorded in the audit log."),
        responses={(200, "application/zip"): OpenApiTypes.BINARY,
                   404: OpenApiResponse(description="No such stack visible to the caller")},
    )
    def get(self, request: Request, stack: str) -> StreamingHttpResponse:
        principal = principal_of(request)
        target = stack_for_principal(principal, stack)
        enter_bulk_lane(request._request, target.organization_id)
        now = timezone.now()
        audit_record(organization=target.organization, action="stack.exported", principal=principal,
                     target_type="stack", target_id=target.slug, ip=client_ip(request),
                     metadata={"format": "zip", "format_version": ARCHIVE_FORMAT_VERSION})
        audience = audience_for(principal, stack_id=target.pk)
        chunks = archive_chunks(stack=target, now=now, audience=audience,
                                include_access_log=may_read_access_log(principal, target))
        record_request_access(request, stack_id=target.pk, path=AccessPath.EXPORT,
                              memory_ids=archive_memory_ids(stack=target, audience=audience))
        content = streamed_content(request._request, release_when_streamed(request._request, chunks))
        response = StreamingHttpResponse(content, content_type="application/zip")
        response["Content-Disposition"] = f'attachment; filename="{archive_filename(target, now)}"'
        response["Cache-Control"] = "private, no-store"
        return response


class RetentionSerializer(serializers.Serializer):
    retention_days = serializers.DictField(
        child=serializers.IntegerField(min_value=1), allow_empty=True,
        help_text=f"Days to keep each memory kind after its creation, e.g. {{\"raw\": 365}}; kinds: "
                  f"{', '.join(MemoryKind.values)}. A kind left out is kept (until its own expiry or an erasure).")


class RetentionView(APIView):
    @extend_schema(tags=[TAG], responses=RetentionSerializer, summary="The school's retention policy per kind")
    def get(self, request: Request) -> Response:
        principal = principal_of(request)
        ensure_may_manage_organization(principal)
        return Response({"retention_days": retention_of(principal.organization)})

    @extend_schema(tags=[TAG], request=RetentionSerializer, responses=RetentionSerializer,
                   summary="Set the school's retention policy (enforced by the TTL job)")
    def put(self, request: Request) -> Response:
        principal = principal_of(request)
        ensure_may_manage_organization(principal)  # refuses read-only keys too
        body = request.data if isinstance(request.data, dict) else {}
        days = retention_set(organization=principal.organization, policy=body.get("retention_days"),
                             principal=principal, ip=client_ip(request))
        return Response({"retention_days": days})


urlpatterns = [
    path("api/v1/stacks/<str:stack>/export/archive", StackArchiveView.as_view(), name="stack-export-archive"),
    path("api/v1/retention", RetentionView.as_view(), name="retention"),
]
