"""A student's consent and pause over the native API (docs/consent.md "API").

Thin views: the stack is resolved by the one access decision (a stack the caller cannot see is a
404); who may record consent or pause, and what each step does, is memories.governance.consent.
Over the API only school admins (signed in, or a writable school key) record paper consent, pause
and resume; guardians give online consent on the dashboard.
"""

from __future__ import annotations

from typing import Any

from django.urls import path
from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.network import client_ip
from accounts.principal import principal_of
from memories.governance.consent import (
    NOTE_MAX,
    ConsentState,
    consent_give,
    consent_state,
    consent_withdraw,
    ensure_may_read_consent,
    memory_pause,
    memory_resume,
)
from memories.models import ErasureCertificate
from memories.serializers import validated
from stacks.models import StackConsent
from stacks.selectors import stack_for_principal

TAG = "consent"


class ConsentInSerializer(serializers.Serializer):
    action = serializers.ChoiceField(choices=StackConsent.Action.choices,
                                     help_text="`given`: record the guardian's paper consent; `withdrawn`: record "
                                               "its withdrawal (the school's `consent_withdrawal` decides whether "
                                               "the memory is then kept or erased).")
    note = serializers.CharField(required=False, allow_blank=True, max_length=NOTE_MAX,
                                 help_text="E.g. where the signed form is kept.")


class ConsentStepSerializer(serializers.Serializer):
    action = serializers.ChoiceField(choices=StackConsent.Action.choices)
    method = serializers.ChoiceField(choices=StackConsent.Method.choices,
                                     help_text="`online`: by a guardian, signed in; `paper`: recorded by an admin.")
    by = serializers.CharField(help_text="The admin's name or e-mail, or \"guardian <name>\".")
    at = serializers.DateTimeField()
    note = serializers.CharField()


class ConsentStateSerializer(serializers.Serializer):
    stack = serializers.CharField()
    required = serializers.BooleanField(  # type: ignore[assignment]  # a field named like Field.required
        help_text="The school requires consent before agents write.")
    in_force = serializers.BooleanField(help_text="Consent is given and not withdrawn.")
    given_at = serializers.DateTimeField(allow_null=True)
    paused = serializers.BooleanField()
    paused_at = serializers.DateTimeField(allow_null=True)
    paused_by = serializers.CharField(help_text="Who paused it: a member of staff's name, or \"guardian <name>\".")
    writes_allowed = serializers.BooleanField(help_text="Agents may write now (consent permitting, not paused).")
    text = serializers.CharField(help_text="The consent text guardians agree to.")
    history = ConsentStepSerializer(many=True, help_text="Newest first.")
    erasure = serializers.UUIDField(allow_null=True, required=False,
                                    help_text="A withdrawal under `consent_withdrawal = erase`: the certificate.")


def _document(slug: str, state: ConsentState, certificate: ErasureCertificate | None = None) -> dict[str, Any]:
    return {
        "stack": slug, "required": state.required, "in_force": state.in_force, "given_at": state.given_at,
        "paused": state.paused, "paused_at": state.paused_at, "paused_by": state.paused_by,
        "writes_allowed": state.writes_allowed, "text": state.text,
        "history": [{"action": s.action, "method": s.method, "by": s.by, "at": s.at, "note": s.note}
                    for s in state.history],
        "erasure": str(certificate.id) if certificate is not None else None,
    }


_REFUSALS = {403: OpenApiResponse(description="Not a school admin or a writable school key (`admin_required`)"),
             404: OpenApiResponse(description="No such stack, or not one the caller can see")}


class StackConsentView(APIView):
    @extend_schema(tags=[TAG], operation_id="stack_consent_get", responses={
        200: ConsentStateSerializer, 403: OpenApiResponse(description="A student's agent key"),
        404: _REFUSALS[404]}, summary="A student's consent (required? in force?), pause and consent history")
    def get(self, request: Request, stack: str) -> Response:
        principal = principal_of(request)
        target = stack_for_principal(principal, stack)
        ensure_may_read_consent(principal)
        return Response(_document(target.slug, consent_state(target)))

    @extend_schema(tags=[TAG], operation_id="stack_consent_record", request=ConsentInSerializer, responses={
        200: ConsentStateSerializer, 409: OpenApiResponse(description="Already given / not in force"), **_REFUSALS},
        examples=[OpenApiExample("Paper consent", request_only=True,
                                 value={"action": "given", "note": "signed form in the office, 2026-11-28"})],
        summary="Record a guardian's paper consent, or its withdrawal (school admins; audited)")
    def post(self, request: Request, stack: str) -> Response:
        principal = principal_of(request)
        target = stack_for_principal(principal, stack)
        data = validated(ConsentInSerializer, request.data)
        ip = client_ip(request)
        if data["action"] == StackConsent.Action.GIVEN:
            state = consent_give(target, by=principal, method=StackConsent.Method.PAPER, ip=ip,
                                 note=data.get("note", ""))
            return Response(_document(target.slug, state))
        state, certificate = consent_withdraw(target, by=principal, method=StackConsent.Method.PAPER, ip=ip,
                                              note=data.get("note", ""))
        return Response(_document(target.slug, state, certificate))


class StackPauseView(APIView):
    @extend_schema(tags=[TAG], operation_id="stack_memory_pause", request=None,
                   responses={200: ConsentStateSerializer, **_REFUSALS},
                   summary="Pause a student's memory: agents' writes are refused (`memory_paused`), reads go on")
    def post(self, request: Request, stack: str) -> Response:
        principal = principal_of(request)
        target = stack_for_principal(principal, stack)
        return Response(_document(target.slug, memory_pause(target, by=principal, ip=client_ip(request))))


class StackResumeView(APIView):
    @extend_schema(tags=[TAG], operation_id="stack_memory_resume", request=None,
                   responses={200: ConsentStateSerializer, **_REFUSALS},
                   summary="Resume a paused student's memory")
    def post(self, request: Request, stack: str) -> Response:
        principal = principal_of(request)
        target = stack_for_principal(principal, stack)
        return Response(_document(target.slug, memory_resume(target, by=principal, ip=client_ip(request))))


urlpatterns = [
    path("api/v1/stacks/<str:stack>/consent", StackConsentView.as_view(), name="stack-consent"),
    path("api/v1/stacks/<str:stack>/pause", StackPauseView.as_view(), name="stack-pause"),
    path("api/v1/stacks/<str:stack>/resume", StackResumeView.as_view(), name="stack-resume"),
]
