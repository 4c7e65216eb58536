"""`GET /api/v1/stacks/{stack}/access-log`: who was served which memories of a stack, newest first,
cursor-paginated, filtered (docs/privacy.md "Access log", docs/api.md).

Thin: the stack and the rule come from memories.reads.access_history (`stack_for_access_log`: 404
for a stack out of reach, 403 `access_log_forbidden` for a reader who is neither a school admin nor
the stack's own credentials), the filters from their request serializer.
"""

from __future__ import annotations

from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.principal import principal_of
from memories.reads.access_history import access_log_rows, stack_for_access_log
from memories.serializers import validated
from memories.serializers.access_log import AccessLogQuerySerializer, MemoryAccessSerializer
from memoryhub.pagination import StableCursorPagination


class AccessLogPagination(StableCursorPagination):
    ordering = "-at"


class AccessLogView(APIView):
    @extend_schema(
        tags=["privacy"], operation_id="stack_access_log",
        parameters=[AccessLogQuerySerializer,
                    OpenApiParameter("cursor", OpenApiTypes.STR, description="`next` of the previous page"),
                    OpenApiParameter("limit", OpenApiTypes.INT, description="Page size (at most 500)")],
        responses={200: MemoryAccessSerializer(many=True),
                   400: OpenApiResponse(description="A bad filter or cursor; `error.fields` names it"),
                   403: OpenApiResponse(description="Neither a school admin nor the stack's own credentials: "
                                                    "`access_log_forbidden`"),
                   404: OpenApiResponse(description="No such stack visible to the caller")},
        summary="Who was served which memories of the stack (newest first; never any memory text)",
    )
    def get(self, request: Request, stack: str) -> Response:
        target = stack_for_access_log(principal_of(request), stack)
        filters = validated(AccessLogQuerySerializer, request.query_params)
        rows = access_log_rows(stack=target, **filters)
        paginator = AccessLogPagination()
        page = paginator.paginate_queryset(rows, request, view=self)
        return paginator.get_paginated_response(MemoryAccessSerializer(page, many=True).data)


urlpatterns = [
    path("api/v1/stacks/<str:stack>/access-log", AccessLogView.as_view(), name="stack-access-log"),
]
