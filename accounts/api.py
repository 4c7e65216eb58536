"""Native API for school admins and school keys: keys, members and the audit log (/api/v1/…)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from accounts.kernle_api import ERRORS
from accounts.network import client_ip
from accounts.principal import principal_of
from accounts.selectors import (
    audit_events_visible_to,
    ensure_may_manage_organization,
    key_for_principal,
    key_to_change,
    keys_visible_to,
    members_visible_to,
)
from accounts.serializers import (
    AuditEventSerializer,
    KeyCreatedSerializer,
    KeyCycledSerializer,
    KeyIssueSerializer,
    KeySummarySerializer,
    MemberCreatedSerializer,
    MemberCreateSerializer,
    MemberSerializer,
    key_cycled,
    key_summary,
    key_with_secret,
)
from accounts.services import api_key_cycle, api_key_issue, api_key_revoke, member_create, membership_remove
from accounts.throttles import KEY_CREATE_THROTTLES, RequestRateThrottle
from memoryhub.errors import Forbidden
from memoryhub.pagination import StableCursorPagination
from stacks.selectors import stack_for_principal

FORBIDDEN = {403: OpenApiResponse(description="Not allowed for this role or credential")}
NOT_FOUND = {404: OpenApiResponse(description="Not visible to the caller")}


class KeyListView(APIView):
    def get_throttles(self) -> list[BaseThrottle]:
        if self.request is not None and self.request.method == "POST":
            return [throttle() for throttle in KEY_CREATE_THROTTLES]
        return [RequestRateThrottle()]

    @extend_schema(operation_id="keys_list", tags=["keys"], responses={200: KeySummarySerializer(many=True), **ERRORS},
                   summary="Keys the caller may see (school: all; agent key: its stack's; teacher: assigned stacks')")
    def get(self, request: Request) -> Response:
        paginator = StableCursorPagination()
        page = paginator.paginate_queryset(keys_visible_to(principal_of(request)), request, view=self)
        return paginator.get_paginated_response([key_summary(key) for key in page or []])

    @extend_schema(operation_id="keys_issue", tags=["keys"], request=KeyIssueSerializer,
                   responses={201: KeyCreatedSerializer, **FORBIDDEN, **NOT_FOUND, **ERRORS},
                   summary="Issue a key bound to a stack (agent key) or to the school; the secret is shown once")
    def post(self, request: Request) -> Response:
        principal = principal_of(request)
        serializer = KeyIssueSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        stack_pk = None
        if data["stack_id"]:
            # Visibility decides first: a stack the caller cannot see is a 404, not a 403.
            stack_pk = stack_for_principal(principal, data["stack_id"], write=True).pk
        else:
            ensure_may_manage_organization(principal)
        if principal.read_only:
            raise Forbidden("This key is read-only.", code="read_only_key")
        if principal.is_stack_bound:
            raise Forbidden("An agent key cannot issue keys.", code="admin_required")
        key, secret = api_key_issue(organization=principal.organization, user=principal.user, stack_id=stack_pk,
                                    name=data["name"], read_only=data["read_only"], expires_at=data["expires_at"],
                                    principal=principal, ip=client_ip(request))
        return Response(key_with_secret(key, secret), status=status.HTTP_201_CREATED)


class KeyDetailView(APIView):
    @extend_schema(operation_id="keys_retrieve", tags=["keys"], responses={200: KeySummarySerializer, **NOT_FOUND,
                                                                           **ERRORS})
    def get(self, request: Request, key_id: str) -> Response:
        return Response(key_summary(key_for_principal(principal_of(request), key_id)))

    @extend_schema(operation_id="keys_revoke", tags=["keys"], request=None,
                   responses={204: None, **FORBIDDEN, **NOT_FOUND, **ERRORS}, summary="Revoke a key")
    def delete(self, request: Request, key_id: str) -> Response:
        principal = principal_of(request)
        key = key_to_change(principal, key_id)
        api_key_revoke(key=key, principal=principal, ip=client_ip(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class KeyCycleView(APIView):
    throttle_classes = list(KEY_CREATE_THROTTLES)

    @extend_schema(operation_id="keys_cycle", tags=["keys"], request=None,
                   responses={200: KeyCycledSerializer, **FORBIDDEN, **NOT_FOUND, **ERRORS},
                   summary="Replace a key atomically (same binding and flags); the new secret is shown once")
    def post(self, request: Request, key_id: str) -> Response:
        principal = principal_of(request)
        key = key_to_change(principal, key_id)
        new_key, secret = api_key_cycle(key=key, principal=principal, ip=client_ip(request))
        return Response(key_cycled(key, new_key, secret))


class MemberListView(APIView):
    @extend_schema(operation_id="members_list", tags=["members"],
                   responses={200: MemberSerializer(many=True), **FORBIDDEN, **ERRORS})
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


class MemberDetailView(APIView):
    @extend_schema(operation_id="members_remove", tags=["members"], request=None,
                   responses={204: None, **FORBIDDEN, **NOT_FOUND, **ERRORS},
                   summary="Remove a person from the school; their keys here are revoked")
    def delete(self, request: Request, user_id: str) -> Response:
        principal = principal_of(request)
        ensure_may_manage_organization(principal)
        membership_remove(organization=principal.organization, user_public_id=user_id, principal=principal,
                          ip=client_ip(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class AuditLogView(APIView):
    @extend_schema(operation_id="audit_list", tags=["audit"],
                   responses={200: AuditEventSerializer(many=True), **FORBIDDEN, **ERRORS},
                   summary="The school's security audit log, newest first (admins)")
    def get(self, request: Request) -> Response:
        paginator = StableCursorPagination()
        page = paginator.paginate_queryset(audit_events_visible_to(principal_of(request)), request, view=self)
        return paginator.get_paginated_response(AuditEventSerializer(page or [], many=True).data)
