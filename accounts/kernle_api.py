"""The kernle CLI's auth routes, exactly as docs/kernle-protocol.md §2 describes them.

Paths have no trailing slash: the CLI appends them directly to the backend URL. `POST /auth/register`
creates a stack, so it is served from stacks.kernle_api (accounts sits below stacks).
"""

from __future__ import annotations

from datetime import UTC, datetime

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from accounts.authentication import BearerAuthentication, access_token_for_key, access_token_lifetime_seconds
from accounts.network import client_ip
from accounts.principal import principal_of
from accounts.schema import ERRORS
from accounts.selectors import key_to_change, keys_visible_to, may_manage_own_keys
from accounts.serializers import (
    KernleKeyCreateSerializer,
    KernleLoginSerializer,
    KernleMeSerializer,
    KeyCreatedSerializer,
    KeyCycledSerializer,
    KeySummarySerializer,
    key_cycled,
    key_summary,
    key_with_secret,
)
from accounts.services import api_key_cycle, api_key_issue, api_key_revoke, login_record
from accounts.throttles import (
    KEY_CREATE_THROTTLES,
    LOGIN_THROTTLES,
    IpThrottledFirstMixin,
    RequestRateThrottle,
    SchoolThrottle,
)
from memoryhub.errors import Forbidden, NotAuthenticated


class LoginView(IpThrottledFirstMixin, APIView):
    authentication_classes = [BearerAuthentication]
    throttle_classes = list(LOGIN_THROTTLES)

    @extend_schema(
        operation_id="kernle_auth_login", tags=["kernle auth"], request=None,
        responses={200: KernleLoginSerializer, **ERRORS},
        summary="Exchange an API key (or a valid access token) for a fresh access token (§2.3)",
    )
    def post(self, request: Request) -> Response:
        principal = principal_of(request)
        if principal.api_key is None:  # pragma: no cover - only Bearer authentication here
            raise NotAuthenticated("Invalid API key")
        key = principal.api_key
        token = access_token_for_key(key)
        login_record(user=principal.user, ip=client_ip(request), succeeded=True, via="api_key", principal=principal)
        return Response({
            "user_id": principal.user.public_id,
            "token": str(token),
            "token_expires": datetime.fromtimestamp(int(token["exp"]), tz=UTC).isoformat(),
            "token_type": "bearer",
            "expires_in": access_token_lifetime_seconds(token),
            "stack_id": key.stack.slug if key.stack_id and key.stack else None,
        })


class KeysView(APIView):
    def get_throttles(self) -> list[BaseThrottle]:
        if self.request is not None and self.request.method == "POST":
            return [throttle() for throttle in KEY_CREATE_THROTTLES]
        return [RequestRateThrottle(), SchoolThrottle()]

    @extend_schema(operation_id="kernle_auth_keys_list", tags=["kernle auth"],
                   responses={200: KeySummarySerializer(many=True), **ERRORS},
                   summary="The caller's keys as a bare JSON array, revoked ones with is_active false (§2.4)")
    def get(self, request: Request) -> Response:
        keys = keys_visible_to(principal_of(request)).order_by("created_at", "pk")
        return Response([key_summary(key) for key in keys])

    @extend_schema(operation_id="kernle_auth_keys_create", tags=["kernle auth"], request=KernleKeyCreateSerializer,
                   responses={201: KeyCreatedSerializer, 403: OpenApiResponse(description="Not allowed"), **ERRORS},
                   summary="Create an account-wide key, not bound to a stack (§2.5)")
    def post(self, request: Request) -> Response:
        principal = principal_of(request)
        serializer = KernleKeyCreateSerializer(data=request.data if isinstance(request.data, dict) else None)
        serializer.is_valid(raise_exception=True)
        if not may_manage_own_keys(principal):
            raise Forbidden("This credential may not create keys.", code="admin_required")
        key, secret = api_key_issue(organization=principal.organization, user=principal.user,
                                    name=serializer.validated_data.get("name") or "", principal=principal,
                                    ip=client_ip(request))
        return Response(key_with_secret(key, secret), status=status.HTTP_201_CREATED)


class KeyDetailView(APIView):
    @extend_schema(operation_id="kernle_auth_keys_revoke", tags=["kernle auth"], request=None,
                   responses={204: None, 404: OpenApiResponse(description="Not the caller's key"), **ERRORS},
                   summary="Revoke a key (§2.6)")
    def delete(self, request: Request, key_id: str) -> Response:
        principal = principal_of(request)
        key = key_to_change(principal, key_id)
        api_key_revoke(key=key, principal=principal, ip=client_ip(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class KeyCycleView(APIView):
    throttle_classes = list(KEY_CREATE_THROTTLES)

    @extend_schema(operation_id="kernle_auth_keys_cycle", tags=["kernle auth"], request=None,
                   responses={200: KeyCycledSerializer, 404: OpenApiResponse(description="Unknown key"), **ERRORS},
                   summary="Deactivate a key and issue its replacement atomically; flat fields (§2.7)")
    def post(self, request: Request, key_id: str) -> Response:
        principal = principal_of(request)
        key = key_to_change(principal, key_id)
        new_key, secret = api_key_cycle(key=key, principal=principal, ip=client_ip(request))
        return Response(key_cycled(key, new_key, secret))



class MeView(APIView):
    @extend_schema(operation_id="kernle_auth_me", tags=["kernle auth"], responses={200: KernleMeSerializer, **ERRORS},
                   summary="Who the credential acts as (legacy route, docs/kernle-protocol.md §2.8)")
    def get(self, request: Request) -> Response:
        principal = principal_of(request)
        key = principal.api_key
        return Response({
            "user_id": principal.user.public_id,
            "email": principal.user.email or None,
            "organization_id": principal.organization.public_id,
            "organization_kind": principal.organization.kind,
            "tier": principal.organization.tier,
            "key_id": key.public_id if key else None,
            "stack_id": key.stack.slug if key and key.stack_id and key.stack else None,
            "read_only": principal.read_only,
        })
