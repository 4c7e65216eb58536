"""GET/PUT /api/v1/privacy: a school's privacy settings, their defaults and the written policy.

Thin view: who may read or change them and what is valid are memories.governance.privacy_settings (school
admins and writable school keys; anyone else 403). The request serializer documents the body and
refuses what is not a setting (400 `unknown_field`); the service's validators decide the values.
"""

from __future__ import annotations

from typing import Any

from django.urls import path
from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.models import Organization
from accounts.network import client_ip
from accounts.principal import principal_of
from memories.governance.privacy_settings import (
    CONSENT_TEXT_MAX,
    DEFAULTS,
    REQUEST_DAYS_MAX,
    PrivacySettings,
    policy_sections,
    privacy_settings_get,
    privacy_settings_update,
)
from memories.lifecycle.ttl import RETENTION_MAX_DAYS
from memories.models import MemoryKind
from memories.privacy.redaction.rules import PII_CATEGORIES
from memories.serializers.fields import StrictBooleanField

TAG = "privacy"


def _retention_field(**kwargs: Any) -> serializers.DictField:
    return serializers.DictField(
        child=serializers.IntegerField(min_value=1, max_value=RETENTION_MAX_DAYS), allow_empty=True,
        help_text=f"Days to keep each memory kind after its creation, e.g. {{\"raw\": 365}}; kinds: "
                  f"{', '.join(MemoryKind.values)}. A kind left out has no limit (a new school starts with one "
                  f"for every kind).", **kwargs)


def _categories_field(**kwargs: Any) -> serializers.ListField:
    return serializers.ListField(
        child=serializers.ChoiceField(choices=list(PII_CATEGORIES)),
        help_text="The personal-data categories redacted at ingest (secrets are always redacted). "
                  "All of them also covers categories added later.", **kwargs)


def _policy_field(**kwargs: Any) -> serializers.ChoiceField:
    return serializers.ChoiceField(
        choices=Organization.EmptyGrantsPolicy.choices,
        help_text="Who reads a memory whose access_grants is empty: `school` — staff who reach the student; "
                  "`owner` — only the stack's own keys.", **kwargs)


def _originals_field(**kwargs: Any) -> serializers.BooleanField:
    return StrictBooleanField(
        help_text="Keep raw entries' original (unredacted) text, encrypted at rest (AES-256-GCM, keys from "
                  "MEMORYHUB_ENCRYPTION_KEYS). Off: only the redacted text is stored.", **kwargs)


def _provisioning_field(**kwargs: Any) -> serializers.BooleanField:
    return StrictBooleanField(
        help_text="A school key's first kernle push to an unknown student id creates that student's stack, "
                  "within the plan's limits. Off: such a push is a 404 and admins add students first.", **kwargs)


# The families' settings (docs/consent.md).
def _consent_required_field(**kwargs: Any) -> serializers.BooleanField:
    return StrictBooleanField(
        help_text="Agents may write to a student's memory only while a guardian's consent is in force (given "
                  "online by a guardian or recorded on paper by an admin). Writes without it are refused with "
                  "`consent_required`.", **kwargs)


def _consent_text_field(**kwargs: Any) -> serializers.CharField:
    return serializers.CharField(allow_blank=True, max_length=CONSENT_TEXT_MAX, trim_whitespace=False,
                                 help_text="What a guardian agrees to; empty: MemoryHub's default text.", **kwargs)


def _consent_withdrawal_field(**kwargs: Any) -> serializers.ChoiceField:
    return serializers.ChoiceField(
        choices=Organization.ConsentWithdrawal.choices,
        help_text="When consent is withdrawn: `keep` — writes stop, what is stored stays under the retention "
                  "policy; `erase` — writes stop and the student's memory is erased, with a certificate.", **kwargs)


def _guardians_may_pause_field(**kwargs: Any) -> serializers.BooleanField:
    return StrictBooleanField(
        help_text="A guardian may pause (and resume) their child's memory; admins always may.", **kwargs)


def _request_days_field(**kwargs: Any) -> serializers.IntegerField:
    return serializers.IntegerField(
        min_value=1, max_value=REQUEST_DAYS_MAX,
        help_text="Days the school gives itself to answer a guardian's correction or deletion request "
                  "(its due date).", **kwargs)


class PrivacyInSerializer(serializers.Serializer):
    """Any of the settings; those left out keep their value."""

    retention_days = _retention_field(required=False)
    redaction_categories = _categories_field(required=False)
    empty_grants_policy = _policy_field(required=False)
    keep_raw_originals = _originals_field(required=False)
    provision_stacks_on_push = _provisioning_field(required=False)
    consent_required = _consent_required_field(required=False)
    consent_text = _consent_text_field(required=False)
    consent_withdrawal = _consent_withdrawal_field(required=False)
    guardians_may_pause = _guardians_may_pause_field(required=False)
    guardian_request_days = _request_days_field(required=False)


class PrivacyValuesSerializer(serializers.Serializer):
    retention_days = _retention_field()
    redaction_categories = _categories_field()
    empty_grants_policy = _policy_field()
    keep_raw_originals = _originals_field()
    provision_stacks_on_push = _provisioning_field()
    consent_required = _consent_required_field()
    consent_text = _consent_text_field()
    consent_withdrawal = _consent_withdrawal_field()
    guardians_may_pause = _guardians_may_pause_field()
    guardian_request_days = _request_days_field()


class PolicySectionSerializer(serializers.Serializer):
    title = serializers.CharField()
    paragraphs = serializers.ListField(child=serializers.CharField())


# Declared as a dict of fields (what the schema documents; the view returns a plain dict).
_OUT = inline_serializer("PrivacySettingsOut", fields={
    "retention_days": _retention_field(), "redaction_categories": _categories_field(),
    "empty_grants_policy": _policy_field(), "keep_raw_originals": _originals_field(),
    "provision_stacks_on_push": _provisioning_field(), "consent_required": _consent_required_field(),
    "consent_text": _consent_text_field(), "consent_withdrawal": _consent_withdrawal_field(),
    "guardians_may_pause": _guardians_may_pause_field(), "guardian_request_days": _request_days_field(),
    "retention_reviewed_at": serializers.DateTimeField(
        allow_null=True, help_text="When an admin last saved the retention (a kind left without a limit is then "
                                   "their choice); null: never, and any kind without a limit awaits review."),
    "defaults": PrivacyValuesSerializer(help_text="What a new school starts with (a limit for every kind)."),
    "pii_categories": serializers.ListField(child=serializers.CharField(),
                                            help_text="Every category `redaction_categories` may name."),
    "policy": PolicySectionSerializer(many=True, help_text="The school's retention policy in plain words, as "
                                                           "these settings make it."),
})


def _document(settings: PrivacySettings, organization: Organization) -> dict[str, Any]:
    return {
        **settings.as_dict(), "defaults": DEFAULTS.values(), "pii_categories": list(PII_CATEGORIES),
        "policy": [{"title": s.title, "paragraphs": list(s.paragraphs)} for s in policy_sections(
            settings, school=organization.name, access_log_days=organization.access_log_retention_days)],
    }


class PrivacyView(APIView):
    @extend_schema(tags=[TAG], operation_id="privacy_get", responses={
        200: _OUT, 403: OpenApiResponse(description="Not a school admin or a writable school key")},
        summary="The school's privacy settings, their defaults and the written retention policy")
    def get(self, request: Request) -> Response:
        principal = principal_of(request)
        return Response(_document(privacy_settings_get(principal), principal.organization))

    @extend_schema(tags=[TAG], operation_id="privacy_update", request=PrivacyInSerializer, responses={
        200: _OUT, 400: OpenApiResponse(description="An invalid setting; nothing was changed"),
        403: OpenApiResponse(description="Not a school admin or a writable school key")},
        examples=[OpenApiExample("Keep raw entries a year, redact e-mail addresses only", request_only=True,
                                 value={"retention_days": {"raw": 365}, "redaction_categories": ["email"]})],
        summary="Change any of the school's privacy settings (one audited change)")
    def put(self, request: Request) -> Response:
        principal = principal_of(request)
        # The service validates the body (one set of rules with the dashboard's form).
        settings = privacy_settings_update(principal=principal, changes=request.data, ip=client_ip(request))
        return Response(_document(settings, principal.organization))


urlpatterns = [
    path("api/v1/privacy", PrivacyView.as_view(), name="privacy"),
]
