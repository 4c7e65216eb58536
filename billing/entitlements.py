"""What an organization's tier entitles it to: the one interface other apps ask billing.

`memories` never reads tiers itself; it calls `ensure_can_store` (or reads the remaining
allowance for per-operation decisions in a batch) and gets a `QuotaExceeded` naming the limit
when the answer is no. The tier table is `accounts.tiers` (see there why it is not in billing).

Usage is read from the stacks' counters (`Stack.bytes_used`, maintained by every memory write),
so a check costs one aggregate over the organization's stacks, not a scan of its memories.

The limits follow the subscription: billing.services keeps `Organization.tier` in step with it
(a confirmed payment raises it, a lapsed period or a downgrade lowers it). A paid tier with
overflow prices (core, pro; docs/kernle-protocol.md §12.6-12.7) whose subscription is in good
standing is not refused past its storage or stack limit: the overflow is accepted and billed with
the next renewal (billing.selectors.overflow_charge). The stack quota is enforced in stacks, below
billing, so billing.services writes that standing onto the organization (`Organization.overflow_tier`)
and both limits read it from there (billing.selectors.overflow_allowed).
"""

from __future__ import annotations

from dataclasses import replace

from django.db import connection

from accounts.models import Organization
from accounts.principal import Principal
from accounts.tiers import tier_for
from billing.selectors import OVERFLOW, PRICES, may_read_billing, overflow_allowed, overflow_charge, usage_of, usdc
from memoryhub.errors import QuotaExceeded
from stacks.models import Stack
from stacks.selectors import ensure_may_activate_stack

# Written out: a capped school's every write and push asks it, and compiling the aggregate's
# queryset cost more than running it (docs/benchmarks.md "Figures behind code choices").
_STORAGE_USED_SQL = f"SELECT COALESCE(SUM(bytes_used), 0) FROM {Stack._meta.db_table} WHERE organization_id = %s"  # noqa: S608


def storage_used(*, organization: Organization) -> int:
    """Bytes stored by all of the organization's stacks, from their counters."""
    with connection.cursor() as cursor:
        cursor.execute(_STORAGE_USED_SQL, [organization.pk])
        return int(cursor.fetchone()[0])


def storage_remaining(*, organization: Organization) -> int | None:
    """Bytes the organization may still add (never negative); None when nothing refuses growth
    (an unlimited tier, or overflow billed instead)."""
    tier = tier_for(organization)
    if tier.storage_bytes is None:
        return None
    # Only an organization on a tier with overflow prices pays one more lookup (its subscription).
    if tier.name in OVERFLOW and overflow_allowed(organization):
        return None
    return max(0, tier.storage_bytes - storage_used(organization=organization))


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
    `stack_unarchive` enforce on every path; this is the same question asked through billing's door
    (and it gives the same answer: no refusal while overflow is billed, see `overflow_allowed`).
    """
    ensure_may_activate_stack(organization=organization)


# --- cost estimates (memories.reads.usage; docs/kernle-protocol.md §12.7) -----------------------------------


def cost_visible_to(principal: Principal) -> bool:
    """May `principal` see the organization's storage totals and prices? Billing's own read rule
    (every key, admins and billing members; not teachers)."""
    return may_read_billing(principal)


def monthly_cost_estimate(*, organization: Organization, storage_bytes: int) -> dict[str, object]:
    """A month on the organization's tier with `storage_bytes` stored and today's syncing stacks:
    the tier's price plus its overflow (every started GB, every stack past the limit) at §12.7's
    prices, in USDC. `price` is None on a tier priced by contract (enterprise, unlimited). Past the
    storage limit on a tier without overflow prices nothing is billed: writes are refused instead
    (`over_limit`)."""
    tier = tier_for(organization)
    usage = replace(usage_of(organization), storage_used=storage_bytes)
    base = PRICES.get(tier.name, 0 if tier.name == "free" else None)
    prices = OVERFLOW.get(tier.name)
    overflow = overflow_charge(organization, tier=tier.name, usage=usage) if prices else 0
    return {
        "tier": tier.name, "currency": "USDC", "storage_bytes": storage_bytes, "storage_limit": tier.storage_bytes,
        "price": usdc(base) if base is not None else None, "overflow": usdc(overflow),
        "total": usdc(base + overflow) if base is not None else None,
        "overflow_prices": {"per_gb": usdc(prices.per_gb), "per_stack": usdc(prices.per_stack)} if prices else None,
        "overflow_billed": bool(prices) and overflow_allowed(organization),
        "over_limit": tier.storage_bytes is not None and storage_bytes > tier.storage_bytes,
    }
