"""Webhook endpoints (a school's receivers) and their deliveries (one per endpoint and event).

A delivery is the unit of "at least once": it is recorded by the fan-out (dispatch.fan_out) when a
change event commits, unique per (endpoint, event) so a relayed event records nothing twice, and
it stays `pending` until a 2xx answer (`delivered`) or until it has failed for 24 hours (`failed`,
given up). Per stack, an endpoint's deliveries go out in event order (seq): the oldest pending one
of a stack blocks the ones after it.
"""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone


def new_endpoint_public_id() -> str:
    return f"whk_{secrets.token_hex(8)}"


def new_delivery_public_id() -> str:
    return f"whd_{secrets.token_hex(10)}"


class WebhookEndpoint(models.Model):
    class DisabledReason(models.TextChoices):
        NONE = "", "enabled"
        ADMIN = "admin", "disabled by an admin"
        FAILING = "failing", "disabled after failing for 24 hours"

    public_id = models.CharField(max_length=40, unique=True, default=new_endpoint_public_id, editable=False)
    organization = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE,
                                     related_name="webhook_endpoints")
    url = models.URLField(max_length=2000)
    description = models.CharField(max_length=200, blank=True, default="")
    event_types = models.JSONField(default=list)  # e.g. ["memory.created"] or ["*"] (webhooks.event_types)
    include_text = models.BooleanField(default=False)  # send memory text in payloads (opt-in)
    # The signing secret, Fernet-sealed (webhooks.sealing): never stored, logged or shown in clear after creation.
    secret_sealed = models.TextField()
    enabled = models.BooleanField(default=True)
    disabled_reason = models.CharField(max_length=16, choices=DisabledReason.choices, blank=True, default="")
    disabled_at = models.DateTimeField(null=True, blank=True)
    # Start of the current run of failed attempts (None after any success); 24 h of it disables the endpoint.
    failing_since = models.DateTimeField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.IntegerField(null=True, blank=True)
    last_attempt_ok = models.BooleanField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    secret_rotated_at = models.DateTimeField(null=True, blank=True)

    @property
    def needs_attention(self) -> bool:
        return self.disabled_reason == self.DisabledReason.FAILING


class WebhookDelivery(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"  # given up after 24 h of failed attempts

    public_id = models.CharField(max_length=40, unique=True, default=new_delivery_public_id, editable=False)
    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries")
    # The event's stack (null for a test event). Its organization is the endpoint's: the fan-out
    # only pairs an event with endpoints of the stack's own school.
    stack = models.ForeignKey("stacks.Stack", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    # memories.ChangeEvent id and seq, copied (not a foreign key: events are pruned after 7 days,
    # the delivery log outlives them).
    event_id = models.BigIntegerField(null=True, blank=True)
    seq = models.BigIntegerField(null=True, blank=True)
    event_type = models.CharField(max_length=64)
    data = models.JSONField(default=dict)  # memories.changes.feed.event_dict: ids and kinds, never memory text
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.IntegerField(default=0)
    last_status_code = models.IntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=200, blank=True, default="")
    next_attempt_at = models.DateTimeField(default=timezone.now)
    # A sender's lease on the delivery while its request is in flight (no transaction is held).
    claimed_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["endpoint", "event_id"], name="webhooks_delivery_endpoint_event_unique"),
        ]
        indexes = [
            # The head of an (endpoint, stack) queue: its oldest pending delivery.
            models.Index(fields=["endpoint", "stack", "seq"], name="webhooks_delivery_queue",
                         condition=models.Q(status="pending")),
            # The sweep: pending deliveries that are due.
            models.Index(fields=["next_attempt_at"], name="webhooks_delivery_due",
                         condition=models.Q(status="pending")),
            # The delivery log, newest first.
            models.Index(fields=["endpoint", "-created_at"], name="webhooks_delivery_log"),
        ]
