"""Kernle self-registration, `POST /auth/register` (docs/kernle-protocol.md §2.2).

The other kernle auth routes are in accounts.kernle_api; this one creates a stack (a personal
account, its stack and a key bound to it), so it is served from the stacks app, above accounts.
The path has no trailing slash: the CLI appends it directly to the backend URL.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.authentication import access_token_for_key, access_token_lifetime_seconds
from accounts.network import client_ip
from accounts.schema import ERRORS
from accounts.serializers import KernleRegisteredSerializer, KernleRegisterSerializer
from accounts.throttles import REGISTER_THROTTLES, IpThrottledFirstMixin
from memoryhub.errors import InvalidInput
from stacks.services import personal_account_register


class RegisterView(IpThrottledFirstMixin, APIView):
    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]
    throttle_classes = list(REGISTER_THROTTLES)

    @extend_schema(
        operation_id="kernle_auth_register", tags=["kernle auth"], request=KernleRegisterSerializer,
        responses={201: KernleRegisteredSerializer, 409: OpenApiResponse(description="Email already registered"),
                   **ERRORS},
        summary="Register a personal account, its stack and a stack-bound key (docs/kernle-protocol.md §2.2)",
    )
    def post(self, request: Request) -> Response:
        data = request.data
        if not isinstance(data, dict):
            raise InvalidInput("The body must be a JSON object.")
        stack_id = data.get("stack_id")
        if stack_id in (None, ""):
            stack_id = data.get("agent_id")  # the legacy body; stack_id wins when both are present
        if stack_id in (None, ""):
            raise InvalidInput("stack_id is required.", code="invalid_stack_id", fields={"stack_id": ["Required."]})
        registration = personal_account_register(stack_id=stack_id, email=data.get("email"),
                                                 display_name=data.get("display_name"), ip=client_ip(request))
        token = access_token_for_key(registration.key)
        body = {
            "user_id": registration.user.public_id,
            "secret": registration.secret,
            "api_key": registration.secret,
            "key_id": registration.key.public_id,
            "access_token": str(token),
            "token_type": "bearer",
            "expires_in": access_token_lifetime_seconds(token),
            "stack_id": registration.stack.slug,
        }
        return Response(body, status=status.HTTP_201_CREATED)
