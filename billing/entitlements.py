"""What an organization's tier entitles it to: the one interface other apps ask billing.

`memories` never reads tiers itself; it calls `ensure_can_store` (or reads the remaining
allowance for per-operation decisions in a batch) and gets a `QuotaExceeded` naming the limit
when the answer is no. The tier table is `accounts.tiers` (see there why it is not in billing).

Usage is read from the stacks' counters (`Stack.bytes_used`, maintained by every memory write),
so a check costs one aggregate over the organization's stacks, not a scan of its memories.
"""

from __future__ import annotations

from django.db.models import Sum

from accounts.models import Organization
from accounts.tiers import tier_for
from memoryhub.errors import QuotaExceeded
from stacks.models import Stack
from stacks.selectors import ensure_may_activate_stack


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


def ensure_can_create_stack(*, organization: Organization) -> None:
    """Raise QuotaExceeded if the organization already has as many active stacks as its tier allows.

    The rule itself is `stacks.selectors.ensure_may_activate_stack`, which `stack_create` and
    `stack_unarchive` enforce on every path; this is the same question asked through billing's door.
    """
    ensure_may_activate_stack(organization=organization)
