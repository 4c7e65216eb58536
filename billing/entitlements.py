"""What an organization's tier entitles it to: the one interface other apps ask billing.

`memories` and `stacks` never read tiers themselves; they call `ensure_can_store` /
`ensure_can_create_stack` (or read the remaining allowance for per-operation decisions in a
batch) and get a `QuotaExceeded` naming the limit when the answer is no.

Usage is read from the stacks' counters (`Stack.bytes_used`, maintained by every memory write),
so a check costs one aggregate over the organization's stacks, not a scan of its memories.
"""

from __future__ import annotations

import logging

from django.db.models import Sum

from accounts.models import Organization
from billing.tiers import TIERS, Tier
from memoryhub.errors import QuotaExceeded, ServiceUnavailable
from stacks.models import Stack

logger = logging.getLogger(__name__)


def tier_for(organization: Organization) -> Tier:
    """The organization's tier. An unmapped tier name fails closed (503), never "allow"."""
    tier = TIERS.get(organization.tier)
    if tier is None:
        logger.error("organization %s has unmapped tier %r", organization.pk, organization.tier)
        raise ServiceUnavailable("The account's plan cannot be read; retry shortly.", code="tier_unavailable")
    return tier


def storage_used(*, organization: Organization) -> int:
    total = Stack.objects.filter(organization_id=organization.pk).aggregate(total=Sum("bytes_used"))["total"]
    return int(total or 0)


def storage_remaining(*, organization: Organization) -> int | None:
    """Bytes the organization may still add (never negative); None when unlimited."""
    limit = tier_for(organization).storage_bytes
    if limit is None:
        return None
    return max(0, limit - storage_used(organization=organization))


def storage_quota_message(organization: Organization) -> str:
    tier = tier_for(organization)
    return f"storage quota exceeded ({tier.name}: {tier.storage_label}) — upgrade or delete memories"


def storage_quota_error(organization: Organization) -> QuotaExceeded:
    tier = tier_for(organization)
    return QuotaExceeded(
        storage_quota_message(organization),
        code="storage_quota_exceeded",
        fields={"limit": "storage_bytes", "tier": tier.name, "limit_bytes": tier.storage_bytes},
    )


def ensure_can_store(*, stack: Stack, additional_bytes: int) -> None:
    """Raise QuotaExceeded if `stack`'s organization may not store `additional_bytes` more.

    Shrinking or neutral writes (additional_bytes <= 0) are always allowed, so an organization
    over its quota can still delete, forget and trim its way back under it.
    """
    if additional_bytes <= 0:
        return
    remaining = storage_remaining(organization=stack.organization)
    if remaining is not None and additional_bytes > remaining:
        raise storage_quota_error(stack.organization)


def stack_limit_message(organization: Organization) -> str:
    tier = tier_for(organization)
    plural = "stack" if tier.syncing_stacks == 1 else "stacks"
    return f"stack limit reached ({tier.name}: {tier.syncing_stacks} syncing {plural}) — upgrade or archive a stack"


def ensure_can_create_stack(*, organization: Organization) -> None:
    """Raise QuotaExceeded if the organization already has as many active stacks as its tier allows."""
    tier = tier_for(organization)
    if tier.syncing_stacks is None:
        return
    active = Stack.objects.filter(organization_id=organization.pk, status=Stack.Status.ACTIVE).count()
    if active >= tier.syncing_stacks:
        raise QuotaExceeded(
            stack_limit_message(organization),
            code="stack_limit_reached",
            fields={"limit": "syncing_stacks", "tier": tier.name, "limit_stacks": tier.syncing_stacks},
        )
