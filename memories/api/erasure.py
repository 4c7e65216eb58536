"""Erasure API: erase a stack or one memory, read the certificate (JSON or a printable page), verify it.

Thin views: who may erase is `memories.selectors.stack_for_erasure` (a stack the caller cannot see is
a 404; a teacher or an agent key is a 403); the work and the digest are memories.governance.erasure.
Verification is public on purpose: whoever holds a certificate (a parent, an auditor) can check it.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.template import engines
from django.urls import path
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.permissions import AllowAny
from rest_framework.renderers import StaticHTMLRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.network import client_ip
from accounts.principal import principal_of
from memories import selectors
from memories.governance.erasure import (
    REQUESTED_BY_MAX,
    certificate_document,
    certificate_verify,
    memory_erase_request,
    stack_erase_request,
)
from memories.models import ErasureCertificate
from memories.serializers import validated
from memoryhub.errors import InvalidInput, NotFound
from memoryhub.renderers import FastJSONRenderer

TAG = "erasure"


class StackEraseInSerializer(serializers.Serializer):
    requested_by = serializers.CharField(max_length=REQUESTED_BY_MAX, help_text=(
        "At whose request, e.g. 'parent of student X, letter 2026-11-20' (printed on the certificate)."))
    confirm = serializers.CharField(max_length=100, help_text="The stack's id, typed again: erasure is irreversible.")


class MemoryEraseInSerializer(serializers.Serializer):
    requested_by = serializers.CharField(max_length=REQUESTED_BY_MAX, help_text="At whose request.")


class CertificateSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    organization = serializers.CharField()
    stack = serializers.CharField()
    stack_id = serializers.IntegerField()
    scope = serializers.ChoiceField(choices=ErasureCertificate.Scope.choices)
    memory_id = serializers.UUIDField(allow_null=True)
    requested_by = serializers.CharField()
    erased_by = serializers.CharField()
    status = serializers.ChoiceField(choices=ErasureCertificate.Status.choices,
                                     help_text="pending → running (counts so far) → done")
    counts = serializers.DictField(child=serializers.IntegerField(), help_text="What was erased, by kind.")
    requested_at = serializers.DateTimeField()
    completed_at = serializers.DateTimeField(allow_null=True)
    digest = serializers.CharField(allow_null=True, help_text="HMAC-SHA256 of the canonical JSON of the "
                                                              "other fields; set when done.")


class VerifyOutSerializer(serializers.Serializer):
    valid = serializers.BooleanField()


class StackEraseView(APIView):
    @extend_schema(tags=[TAG], operation_id="stack_erase", request=StackEraseInSerializer,
                   responses={200: CertificateSerializer, 202: CertificateSerializer,
                              403: OpenApiResponse(description="Not a school admin"),
                              409: OpenApiResponse(description="An erasure of this stack is under way")},
                   summary="Erase a student's stack irreversibly; returns the certificate "
                           "(202 pending for large stacks, erased by a background job)")
    def post(self, request: Request, stack: str) -> Response:
        principal = principal_of(request)
        target = selectors.stack_for_erasure(principal, stack)
        data = validated(StackEraseInSerializer, request.data)
        cert = stack_erase_request(principal=principal, stack=target, requested_by=data["requested_by"],
                                   confirm=data["confirm"], ip=client_ip(request))
        code = status.HTTP_200_OK if cert.status == ErasureCertificate.Status.DONE else status.HTTP_202_ACCEPTED
        return Response(certificate_document(cert), status=code)


class MemoryEraseView(APIView):
    @extend_schema(tags=[TAG], operation_id="memory_erase", request=MemoryEraseInSerializer,
                   responses={200: CertificateSerializer}, summary="Erase one memory irreversibly")
    def post(self, request: Request, stack: str, memory_id: str) -> Response:
        principal = principal_of(request)
        target = selectors.stack_for_erasure(principal, stack)
        data = validated(MemoryEraseInSerializer, request.data)
        memory = selectors.memory_get(stack=target, memory_id=memory_id)
        cert = memory_erase_request(principal=principal, memory=memory, requested_by=data["requested_by"],
                                    ip=client_ip(request))
        return Response(certificate_document(cert))


_PAGE = engines["django"].from_string("""{% load static %}<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Erasure certificate {{ c.id }}</title>
<link rel="stylesheet" href="{% static 'css/certificate.css' %}"></head><body>
<h1>Certificate of erasure</h1>
<p>MemoryHub certifies that the data below was erased irreversibly. No memory content is kept.</p>
<table>
<tr><th>Certificate</th><td><code>{{ c.id }}</code></td></tr>
<tr><th>School</th><td>{{ c.organization }}</td></tr>
<tr><th>Stack</th><td>{{ c.stack }} (id {{ c.stack_id }})</td></tr>
<tr><th>Scope</th><td>{{ c.scope }}{% if c.memory_id %} — memory <code>{{ c.memory_id }}</code>{% endif %}</td></tr>
<tr><th>Requested by</th><td>{{ c.requested_by }}</td></tr>
<tr><th>Erased by</th><td>{{ c.erased_by }}</td></tr>
<tr><th>Requested at</th><td>{{ c.requested_at }}</td></tr>
<tr><th>Completed at</th><td>{{ c.completed_at|default:"not yet" }}</td></tr>
<tr><th>Status</th><td>{{ c.status }}</td></tr>
</table>
<h2>What was erased</h2>
<table>{% for kind, n in counts %}<tr><th>{{ kind }}</th><td>{{ n }}</td></tr>
{% empty %}<tr><td>nothing</td></tr>{% endfor %}</table>
<h2>Verification</h2>
<p>Digest (HMAC-SHA256): <code>{{ c.digest|default:"pending" }}</code></p>
<p>Check it at <code>GET /api/v1/erasures/{{ c.id }}/verify</code>, or post this certificate's JSON to that address.</p>
</body></html>""")


# Certificates are named by UUID; saying so lets clients (and the schema fuzzer) know a malformed id
# is a 404 before it is sent.
CERTIFICATE_ID = OpenApiParameter("certificate_id", OpenApiTypes.UUID, OpenApiParameter.PATH,
                                  description="The certificate's id")


class ErasureCertificateView(APIView):
    renderer_classes = [FastJSONRenderer, StaticHTMLRenderer]

    @extend_schema(tags=[TAG], operation_id="erasure_get", responses=CertificateSerializer,
                   parameters=[CERTIFICATE_ID, OpenApiParameter("format", str, enum=["json", "html"],
                                                description="`html`: a printable page")],
                   summary="An erasure certificate (school admins of its school)")
    def get(self, request: Request, certificate_id: str) -> Response:
        cert = selectors.erasure_certificate_get(principal_of(request), certificate_id)
        document = certificate_document(cert)
        if request.accepted_renderer.format == "html":
            counts = sorted(document["counts"].items())
            return Response(_PAGE.render({"c": document, "counts": counts}))
        return Response(document)


class ErasureVerifyView(APIView):
    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]

    @extend_schema(tags=[TAG], operation_id="erasure_verify_stored", responses=VerifyOutSerializer,
                   parameters=[CERTIFICATE_ID],
                   summary="Is the stored certificate intact? (public)")
    def get(self, request: Request, certificate_id: str) -> Response:
        cert = _stored(certificate_id)
        return Response({"valid": certificate_verify(certificate_document(cert))})

    @extend_schema(tags=[TAG], operation_id="erasure_verify_posted", request=CertificateSerializer,
                   parameters=[CERTIFICATE_ID],
                   responses=VerifyOutSerializer,
                   summary="Is this certificate (posted as the JSON `GET /api/v1/erasures/{id}` gave) one MemoryHub "
                           "issued, unchanged? (public)")
    def post(self, request: Request, certificate_id: str) -> Response:
        # The body is the certificate exactly as it was handed out: its values are checked as they
        # are (a serializer would re-format dates and ids, and the digest is over the exact values).
        document = request.data
        if not isinstance(document, dict):
            raise InvalidInput("Post the certificate's JSON object.", code="invalid")
        valid = str(document.get("id")) == str(certificate_id) and certificate_verify(document)
        return Response({"valid": valid})


def _stored(certificate_id: str) -> ErasureCertificate:
    try:
        key = uuid.UUID(certificate_id)
    except ValueError:
        raise NotFound("Erasure certificate not found.", code="erasure_not_found") from None
    cert = ErasureCertificate.objects.select_related("organization").filter(pk=key).first()
    if cert is None:
        raise NotFound("Erasure certificate not found.", code="erasure_not_found")
    return cert


urlpatterns = [
    path("api/v1/stacks/<str:stack>/erase", StackEraseView.as_view(), name="stack-erase"),
    path("api/v1/stacks/<str:stack>/memories/<str:memory_id>/erase", MemoryEraseView.as_view(), name="memory-erase"),
    path("api/v1/erasures/<str:certificate_id>", ErasureCertificateView.as_view(), name="erasure-detail"),
    path("api/v1/erasures/<str:certificate_id>/verify", ErasureVerifyView.as_view(), name="erasure-verify"),
]
