"""Reads with rules: a school's webhook endpoints and their delivery logs.

Endpoints belong to a school and are for those who manage it (accounts.selectors
.may_manage_organization: school admins, writable school keys). Another school's endpoint id is a
404, exactly like a missing one.
"""

from __future__ import annotations

from django.db.models import QuerySet

from accounts.principal import Principal
from accounts.selectors import may_manage_organization
from memoryhub.errors import NotFound
from webhooks.models import WebhookDelivery, WebhookEndpoint


def endpoints_visible_to(principal: Principal) -> QuerySet[WebhookEndpoint]:
    if not may_manage_organization(principal):
        return WebhookEndpoint.objects.none()
    return WebhookEndpoint.objects.filter(organization=principal.organization)


def endpoint_for_principal(principal: Principal, endpoint_id: str) -> WebhookEndpoint:
    endpoint = endpoints_visible_to(principal).filter(public_id=endpoint_id).first()
    if endpoint is None:
        raise NotFound("There is no such webhook endpoint.")
    return endpoint


def deliveries_of(endpoint: WebhookEndpoint, *, status: str = "") -> QuerySet[WebhookDelivery]:
    """The endpoint's delivery log, newest first, optionally of one status."""
    deliveries = endpoint.deliveries.select_related("stack").order_by("-created_at", "-pk")
    if status:
        deliveries = deliveries.filter(status=status)
    return deliveries


def last_deliveries(endpoints: list[WebhookEndpoint]) -> dict[int, WebhookDelivery]:
    """Each endpoint's most recent delivery (for the list page), in one query."""
    latest = (WebhookDelivery.objects.filter(endpoint__in=endpoints).order_by("endpoint_id", "-created_at", "-pk")
              .distinct("endpoint_id"))
    return {delivery.endpoint_id: delivery for delivery in latest}
