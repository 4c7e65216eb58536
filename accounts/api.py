"""Native API for school admins and school keys: keys, members and the audit log (/api/v1/…).

Two routes of this family are served from stacks.api, because they decide about stacks and
accounts sits below stacks: listing and issuing keys (`/api/v1/keys/`, a key may be bound to a
stack) and removing a member (`/api/v1/members/{id}/`, their stack assignments go with them).
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.network import client_ip
from accounts.principal import principal_of
from accounts.schema import ERRORS, FORBIDDEN, NOT_VISIBLE
from accounts.selectors import (
    audit_events_visible_to,
    ensure_may_manage_organization,
    key_for_principal,
    key_to_change,
    members_visible_to,
)
from accounts.serializers import (
    AuditEventSerializer,
    KeyCycledSerializer,
    KeySummarySerializer,
    MemberCreatedSerializer,
    MemberCreateSerializer,
    MemberSerializer,
    key_cycled,
    key_summary,
)
from accounts.services import api_key_cycle, api_key_revoke, member_create
from accounts.throttles import KEY_CREATE_THROTTLES
from memoryhub.pagination import StableCursorPagination


class KeyDetailView(APIView):
    @extend_schema(operation_id="keys_retrieve", tags=["keys"], responses={200: KeySummarySerializer, **NOT_VISIBLE,
                                                                           **ERRORS},
                   summary="Read a key (never its secret)")
    def get(self, request: Request, key_id: str) -> Response:
        return Response(key_summary(key_for_principal(principal_of(request), key_id)))

    @extend_schema(operation_id="keys_revoke", tags=["keys"], request=None,
                   responses={204: None, **FORBIDDEN, **NOT_VISIBLE, **ERRORS}, summary="Revoke a key")
    def delete(self, request: Request, key_id: str) -> Response:
        principal = principal_of(request)
        key = key_to_change(principal, key_id)
        api_key_revoke(key=key, principal=principal, ip=client_ip(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class KeyCycleView(APIView):
    throttle_classes = list(KEY_CREATE_THROTTLES)

    @extend_schema(operation_id="keys_cycle", tags=["keys"], request=None,
                   responses={200: KeyCycledSerializer, **FORBIDDEN, **NOT_VISIBLE, **ERRORS},
                   summary="Replace a key atomically (same binding and flags); the new secret is shown once")
    def post(self, request: Request, key_id: str) -> Response:
        principal = principal_of(request)
        key = key_to_change(principal, key_id)
        new_key, secret = api_key_cycle(key=key, principal=principal, ip=client_ip(request))
        return Response(key_cycled(key, new_key, secret))


class MemberListView(APIView):
    @extend_schema(operation_id="members_list", tags=["members"],
                   responses={200: MemberSerializer(many=True), **FORBIDDEN, **ERRORS},
                   summary="The people of the school and their roles (admins and school keys)")
    def get(self, request: Request) -> Response:
        paginator = StableCursorPagination()
        page = paginator.paginate_queryset(members_visible_to(principal_of(request)), request, view=self)
        return paginator.get_paginated_response(MemberSerializer(page or [], many=True).data)

    @extend_schema(operation_id="members_create", tags=["members"], request=MemberCreateSerializer,
                   responses={201: MemberCreatedSerializer, 409: OpenApiResponse(description="Email taken"),
                              **FORBIDDEN, **ERRORS},
                   summary="Create a person in the school (admin-created user); the initial password is shown once")
    def post(self, request: Request) -> Response:
        principal = principal_of(request)
        ensure_may_manage_organization(principal)
        serializer = MemberCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        user, password = member_create(organization=principal.organization, email=data["email"], role=data["role"],
                                       password=data.get("password") or None, first_name=data["first_name"],
                                       last_name=data["last_name"], principal=principal, ip=client_ip(request))
        membership = members_visible_to(principal).get(user=user)
        return Response({**MemberSerializer(membership).data, "initial_password": password},
                        status=status.HTTP_201_CREATED)


class AuditLogView(APIView):
    @extend_schema(operation_id="audit_list", tags=["audit"],
                   responses={200: AuditEventSerializer(many=True), **FORBIDDEN, **ERRORS},
                   summary="The school's security audit log, newest first (admins)")
    def get(self, request: Request) -> Response:
        paginator = StableCursorPagination()
        page = paginator.paginate_queryset(audit_events_visible_to(principal_of(request)), request, view=self)
        return paginator.get_paginated_response(AuditEventSerializer(page or [], many=True).data)
