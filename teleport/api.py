"""Teleport routes (docs/teleport.md): upload, list, read, expire and delete a stack's workspace
snapshots, download one, issue codes, and download by code. Thin: one access decision
(stacks.selectors.stack_for_principal), then one selector or service."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpResponse
from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.network import client_ip
from accounts.principal import principal_of
from memoryhub.errors import InvalidInput
from memoryhub.limits import BoundedBodyParser, BoundedJSONParser
from stacks.selectors import stack_for_principal
from teleport.models import Snapshot
from teleport.selectors import snapshot_archive, snapshot_of, snapshots_of
from teleport.serializers import snapshot_view
from teleport.services import MAX_DAYS, code_issue, snapshot_create, snapshot_delete, snapshot_expire, snapshot_for_code

TAG = "teleport"


class ArchiveParser(BoundedBodyParser):
    """A raw tar.gz body, read up to one byte past the teleport limit (the service refuses it then)."""

    media_type = "application/gzip"

    def max_bytes(self) -> int:
        return int(settings.TELEPORT_MAX_BYTES)


class OctetStreamArchiveParser(ArchiveParser):
    media_type = "application/octet-stream"


_SNAPSHOT = inline_serializer("TeleportSnapshot", fields={
    "id": serializers.UUIDField(), "name": serializers.CharField(),
    "stored_bytes": serializers.IntegerField(help_text="Encrypted size: what the storage quota counts"),
    "unpacked_bytes": serializers.IntegerField(), "file_count": serializers.IntegerField(),
    "stripped": serializers.ListField(child=serializers.DictField(),
                                      help_text='Members left out: [{"name", "reason": "secret_file" | "link"}]'),
    "stripped_count": serializers.IntegerField(),
    "created_at": serializers.DateTimeField(), "expires_at": serializers.DateTimeField(),
})


def _archive_response(snapshot: Snapshot, data: bytes) -> HttpResponse:
    response = HttpResponse(data, content_type="application/gzip")
    response["Content-Disposition"] = f'attachment; filename="snapshot-{snapshot.pk}.tar.gz"'
    response["Cache-Control"] = "private, no-store"
    return response


def _days_param(request: Request) -> int | None:
    raw = request.query_params.get("expires_in_days")
    if raw is None:
        return None
    if not raw.isdigit():
        raise InvalidInput("expires_in_days must be a whole number of days.",
                           fields={"expires_in_days": [f"A whole number from 1 to {MAX_DAYS}."]})
    return int(raw)


class SnapshotsView(APIView):
    parser_classes = [ArchiveParser, OctetStreamArchiveParser]

    @extend_schema(tags=[TAG], summary="Upload a workspace snapshot (tar.gz body)",
                   parameters=[OpenApiParameter("name", str, description="A label, at most 100 characters"),
                               OpenApiParameter("expires_in_days", int,
                                                description=f"1-{MAX_DAYS} (default {MAX_DAYS})")],
                   request={"application/gzip": OpenApiTypes.BINARY},
                   responses={201: _SNAPSHOT, 400: OpenApiResponse(description="Not a tar.gz, or an unsafe member"),
                              402: OpenApiResponse(description="Storage quota exceeded"),
                              413: OpenApiResponse(description="Over TELEPORT_MAX_BYTES compressed or unpacked")})
    def post(self, request: Request, stack: str) -> Response:
        principal = principal_of(request)
        target = stack_for_principal(principal, stack, write=True)
        upload = request.data
        if not isinstance(upload, bytes):  # a parser of ours always gives bytes
            raise InvalidInput("Send the tar.gz as the request body (Content-Type: application/gzip).",
                               code="snapshot_not_targz", fields={"archive": ["Expected a tar.gz body."]})
        snapshot = snapshot_create(stack=target, principal=principal, upload=upload,
                                   name=request.query_params.get("name", ""),
                                   expires_in_days=_days_param(request), ip=client_ip(request))
        return Response(snapshot_view(snapshot), status=201)

    @extend_schema(operation_id="teleport_snapshots_list", tags=[TAG],
                   summary="The stack's live snapshots, newest first",
                   responses={200: inline_serializer("TeleportSnapshotList", fields={
                       "snapshots": serializers.ListField(child=_SNAPSHOT)})})
    def get(self, request: Request, stack: str) -> Response:
        target = stack_for_principal(principal_of(request), stack)
        return Response({"snapshots": [snapshot_view(s) for s in snapshots_of(target)[:200]]})


class SnapshotView(APIView):
    @extend_schema(tags=[TAG], summary="One snapshot", responses={200: _SNAPSHOT})
    def get(self, request: Request, stack: str, snapshot_id: str) -> Response:
        target = stack_for_principal(principal_of(request), stack)
        return Response(snapshot_view(snapshot_of(target, snapshot_id)))

    @extend_schema(tags=[TAG], summary="Delete a snapshot (its codes die with it)", responses={204: None})
    def delete(self, request: Request, stack: str, snapshot_id: str) -> Response:
        principal = principal_of(request)
        target = stack_for_principal(principal, stack, write=True)
        snapshot_delete(snapshot=snapshot_of(target, snapshot_id), principal=principal, ip=client_ip(request))
        return Response(status=204)


class SnapshotExpireView(APIView):
    @extend_schema(tags=[TAG], summary="Expire a snapshot now (the purge removes it)", request=None,
                   responses={200: _SNAPSHOT})
    def post(self, request: Request, stack: str, snapshot_id: str) -> Response:
        principal = principal_of(request)
        target = stack_for_principal(principal, stack, write=True)
        snapshot = snapshot_expire(snapshot=snapshot_of(target, snapshot_id), principal=principal,
                                   ip=client_ip(request))
        return Response(snapshot_view(snapshot))


class SnapshotArchiveView(APIView):
    @extend_schema(tags=[TAG], summary="Download a snapshot's tar.gz",
                   responses={(200, "application/gzip"): OpenApiTypes.BINARY})
    def get(self, request: Request, stack: str, snapshot_id: str) -> HttpResponse:
        target = stack_for_principal(principal_of(request), stack)
        snapshot = snapshot_of(target, snapshot_id)
        return _archive_response(snapshot, snapshot_archive(snapshot))


class CodeRequestSerializer(serializers.Serializer):
    one_time = serializers.BooleanField(default=True, help_text="Dies with its first download (default)")
    expires_in_days = serializers.IntegerField(
        required=False, min_value=1, max_value=MAX_DAYS,
        help_text=f"Default 1 for a one-time code, {MAX_DAYS} otherwise; never beyond the snapshot's expiry")


class SnapshotCodesView(APIView):
    parser_classes = [BoundedJSONParser]

    @extend_schema(tags=[TAG], summary="Issue a teleport code for a snapshot (shown once)",
                   request=CodeRequestSerializer,
                   responses={201: inline_serializer("TeleportCode", fields={
                       "code": serializers.CharField(help_text="Shown once; MemoryHub stores only a hash"),
                       "snapshot": serializers.UUIDField(), "one_time": serializers.BooleanField(),
                       "expires_at": serializers.DateTimeField()})})
    def post(self, request: Request, stack: str, snapshot_id: str) -> Response:
        principal = principal_of(request)
        target = stack_for_principal(principal, stack, write=True)
        serializer = CodeRequestSerializer(data=request.data if request.data else {})
        serializer.is_valid(raise_exception=True)
        issued = code_issue(snapshot=snapshot_of(target, snapshot_id), principal=principal,
                            one_time=serializer.validated_data["one_time"],
                            expires_in_days=serializer.validated_data.get("expires_in_days"), ip=client_ip(request))
        return Response({"code": issued.code, "snapshot": str(issued.row.snapshot_id), "one_time": issued.row.one_time,
                         "expires_at": issued.row.expires_at.isoformat()}, status=201)


class RedeemSerializer(serializers.Serializer):
    code = serializers.CharField(max_length=100, help_text="A teleport code (tlp_…) of your school")


class TeleportDownloadView(APIView):
    parser_classes = [BoundedJSONParser]

    @extend_schema(tags=[TAG], summary="Download the snapshot a teleport code names",
                   description="Any key of the code's school; a code of another school, an expired, used-up or "
                               "unknown code is the same 404.",
                   request=RedeemSerializer, responses={(200, "application/gzip"): OpenApiTypes.BINARY,
                                                        404: OpenApiResponse(description="No such code for you")})
    def post(self, request: Request) -> HttpResponse:
        serializer = RedeemSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        snapshot = snapshot_for_code(principal=principal_of(request), code=serializer.validated_data["code"],
                                     ip=client_ip(request))
        return _archive_response(snapshot, snapshot_archive(snapshot))


urlpatterns = [
    path("api/v1/stacks/<str:stack>/snapshots", SnapshotsView.as_view(), name="teleport-snapshots"),
    path("api/v1/stacks/<str:stack>/snapshots/<str:snapshot_id>", SnapshotView.as_view(), name="teleport-snapshot"),
    path("api/v1/stacks/<str:stack>/snapshots/<str:snapshot_id>/expire", SnapshotExpireView.as_view(),
         name="teleport-snapshot-expire"),
    path("api/v1/stacks/<str:stack>/snapshots/<str:snapshot_id>/archive", SnapshotArchiveView.as_view(),
         name="teleport-snapshot-archive"),
    path("api/v1/stacks/<str:stack>/snapshots/<str:snapshot_id>/codes", SnapshotCodesView.as_view(),
         name="teleport-snapshot-codes"),
    path("api/v1/teleport/download", TeleportDownloadView.as_view(), name="teleport-download"),
]
