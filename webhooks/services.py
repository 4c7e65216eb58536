"""Writes: registering, switching, deleting webhook endpoints, rotating secrets, test events.

Every change is audited (webhook.created, .enabled, .disabled, .deleted, .secret_rotated,
.test_sent) with the caller and address, never with the secret. The caller has already been
resolved to an endpoint it may manage (webhooks.selectors).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import partial
from urllib.parse import urlsplit

from django.db import transaction
from django.utils import timezone

from accounts.models import Organization
from accounts.principal import Principal
from accounts.services import audit_record
from memoryhub.errors import InvalidInput
from webhooks import dispatch, event_types
from webhooks.models import WebhookDelivery, WebhookEndpoint
from webhooks.sealing import new_secret, seal
from webhooks.targets import TargetRefused, target_checked

KNOWN_TYPES = frozenset(name for name, _ in event_types.EVENT_TYPES)


def _audit(endpoint: WebhookEndpoint, action: str, principal: Principal | None, ip: str | None,
           **metadata: object) -> None:
    audit_record(organization=endpoint.organization, action=action, principal=principal, target_type="webhook",
                 target_id=endpoint.public_id, ip=ip, metadata={"url_host": _host(endpoint.url), **metadata})


def _host(url: str) -> str:
    """Only the host is audited: a receiver's path or query may carry a token of theirs."""
    try:
        return urlsplit(url).hostname or ""
    except ValueError:
        return ""


def subscriptions_checked(types: list[str]) -> list[str]:
    chosen = sorted(set(types))
    if not chosen:
        raise InvalidInput("Choose at least one event type.", fields={"event_types": ["Choose at least one."]})
    unknown = [name for name in chosen if name not in KNOWN_TYPES]
    if unknown:
        raise InvalidInput(f"Unknown event type {unknown[0]}.", fields={"event_types": ["Unknown event type."]})
    return [event_types.ALL] if event_types.ALL in chosen else chosen


@transaction.atomic
def endpoint_create(*, organization: Organization, url: str, event_types: list[str], include_text: bool = False,
                    description: str = "", principal: Principal | None = None,
                    ip: str | None = None) -> tuple[WebhookEndpoint, str]:
    """Register an endpoint; return it with its signing secret, which is shown this once only."""
    try:
        target = target_checked(url)
    except TargetRefused as refused:
        raise InvalidInput(str(refused), fields={"url": [str(refused)]}) from None
    secret = new_secret()
    endpoint = WebhookEndpoint.objects.create(
        organization=organization, url=target.url, description=description.strip(),
        event_types=subscriptions_checked(event_types), include_text=include_text, secret_sealed=seal(secret),
        created_by=principal.user if principal else None)
    _audit(endpoint, "webhook.created", principal, ip, event_types=endpoint.event_types,
           include_text=include_text)
    return endpoint, secret


def endpoint_disable(*, endpoint: WebhookEndpoint, principal: Principal | None = None,
                     ip: str | None = None) -> WebhookEndpoint:
    """Stop sending (pending deliveries wait; new events are not recorded for it)."""
    if endpoint.enabled:
        endpoint.enabled = False
        endpoint.disabled_reason = WebhookEndpoint.DisabledReason.ADMIN
        endpoint.disabled_at = timezone.now()
        endpoint.save(update_fields=["enabled", "disabled_reason", "disabled_at"])
        _audit(endpoint, "webhook.disabled", principal, ip, reason="admin")
    return endpoint


def endpoint_enable(*, endpoint: WebhookEndpoint, principal: Principal | None = None,
                    ip: str | None = None) -> WebhookEndpoint:
    """Send again: the failure streak starts afresh and waiting deliveries are queued now."""
    if not endpoint.enabled:
        endpoint.enabled = True
        endpoint.disabled_reason = WebhookEndpoint.DisabledReason.NONE
        endpoint.disabled_at = None
        endpoint.failing_since = None
        endpoint.save(update_fields=["enabled", "disabled_reason", "disabled_at", "failing_since"])
        now = dispatch.clock()
        endpoint.deliveries.filter(status=WebhookDelivery.Status.PENDING).update(next_attempt_at=now)
        _audit(endpoint, "webhook.enabled", principal, ip)
        queues = set(endpoint.deliveries.filter(status=WebhookDelivery.Status.PENDING)
                     .values_list("stack_id", flat=True).distinct())
        for stack_id in queues:
            transaction.on_commit(partial(dispatch.enqueue, endpoint.pk, stack_id))
    return endpoint


def endpoint_delete(*, endpoint: WebhookEndpoint, principal: Principal | None = None, ip: str | None = None) -> None:
    """Delete the endpoint and its delivery log; nothing more is sent to it."""
    _audit(endpoint, "webhook.deleted", principal, ip)
    endpoint.delete()


def endpoint_secret_rotate(*, endpoint: WebhookEndpoint, principal: Principal | None = None,
                           ip: str | None = None) -> str:
    """A new signing secret, effective for the next attempt; the old one stops at once. Shown once."""
    secret = new_secret()
    endpoint.secret_sealed = seal(secret)
    endpoint.secret_rotated_at = timezone.now()
    endpoint.save(update_fields=["secret_sealed", "secret_rotated_at"])
    _audit(endpoint, "webhook.secret_rotated", principal, ip)
    return secret


def endpoint_test_send(*, endpoint: WebhookEndpoint, principal: Principal | None = None,
                       ip: str | None = None) -> WebhookDelivery:
    """Queue a `webhook.test` delivery (no stack, no memory data) through the normal sender."""
    if not endpoint.enabled:
        raise InvalidInput("Enable the endpoint before sending a test event.", code="endpoint_disabled")
    now = dispatch.clock()
    delivery = WebhookDelivery.objects.create(
        endpoint=endpoint, event_type=event_types.TEST, next_attempt_at=now, created_at=now,
        data={"id": None, "stack": None, "seq": None, "topic": "webhook", "action": "test", "source": "dashboard",
              "memory_ids": [], "at": now.isoformat()})
    _audit(endpoint, "webhook.test_sent", principal, ip, delivery=delivery.public_id)
    transaction.on_commit(partial(dispatch.enqueue, endpoint.pk, None))
    return delivery


# The delivery log on the dashboard covers this long; older finished deliveries are deleted by the
# daily `webhooks.prune` task (pending ones stay until delivered or given up, 24 h at most).
DELIVERY_LOG_RETENTION = timedelta(days=30)
PRUNE_BATCH = 5_000


def deliveries_prune(*, now: datetime | None = None) -> int:
    """Delete finished (delivered or given-up) deliveries older than DELIVERY_LOG_RETENTION, in
    bounded batches so the table is never locked for long. Returns how many went."""
    cutoff = (now or timezone.now()) - DELIVERY_LOG_RETENTION
    finished = WebhookDelivery.objects.filter(finished_at__lt=cutoff).exclude(status=WebhookDelivery.Status.PENDING)
    removed = 0
    while True:
        batch = list(finished.values_list("pk", flat=True)[:PRUNE_BATCH])
        if not batch:
            return removed
        removed += WebhookDelivery.objects.filter(pk__in=batch).delete()[0]


def deliveries_erase_for_stack(stack_id: int) -> dict[str, int]:
    """A student's stack is erased (memories.governance.erasure): every delivery about it goes, sent or not —
    payloads name its memories — but the erasure's own notices ("erase" events, memory ids only),
    so integrators hear of it and can delete their copies."""
    deleted, _ = WebhookDelivery.objects.filter(stack_id=stack_id).exclude(data__action="erase").delete()
    return {"webhook_deliveries": deleted}
