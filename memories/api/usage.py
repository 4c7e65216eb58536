"""GET /api/v1/stacks/<stack>/usage: the stack's bytes by kind, growth per month and the projected
monthly cost on the organization's tier (memories/reads/usage.py). Whoever may read the stack may ask;
the organization's totals and prices come only to whom billing shows them (else `organization`
is null)."""

from __future__ import annotations

from django.urls import path
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.principal import principal_of
from memories.reads.usage import stack_usage
from stacks.selectors import stack_for_principal

_USAGE = inline_serializer("StackUsage", fields={
    "stack": serializers.CharField(),
    "bytes_used": serializers.IntegerField(help_text="What the storage quota counts for this stack"),
    "bytes_by_kind": serializers.DictField(help_text='{"note": {"bytes", "count"}, …, "snapshots": {…}}'),
    "growth": serializers.ListField(child=serializers.DictField(),
                                    help_text='[{"month": "2026-11", "bytes"}], the last 6 months'),
    "growth_per_month": serializers.IntegerField(help_text="Bytes per 30 days over the last 90 days"),
    "projected_bytes_next_month": serializers.IntegerField(),
    "organization": serializers.DictField(
        allow_null=True, help_text="storage_used, growth_per_month, projected_storage_next_month, cost_now and "
                                   "projected_monthly_cost ({tier, currency, price, overflow, total, overflow_prices, "
                                   "overflow_billed, over_limit}); null for callers who do not see billing"),
})


class StackUsageView(APIView):
    @extend_schema(tags=["memories"], summary="Storage by kind, growth and projected monthly cost",
                   responses={200: _USAGE})
    def get(self, request: Request, stack: str) -> Response:
        principal = principal_of(request)
        target = stack_for_principal(principal, stack)
        return Response(stack_usage(stack=target, principal=principal))


urlpatterns = [
    path("api/v1/stacks/<str:stack>/usage", StackUsageView.as_view(), name="stack-usage"),
]
