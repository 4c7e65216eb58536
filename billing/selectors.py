"""Billing reads that carry a rule: who may read and manage an organization's billing, prices and
overflow (docs/kernle-protocol.md §12.7), the subscription and usage as §12.8 shows them, and the
payments and wallets a caller may reach."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import DEFAULT_DB_ALIAS
from django.db.models import Count, Max, Q, QuerySet, Sum
from django.utils import timezone

from accounts.models import Membership, Organization, User
from accounts.principal import Principal
from accounts.tiers import GB, TIERS, tier_for
from billing.models import Payment, Subscription, Wallet
from memoryhub.errors import Forbidden, NotFound
from memoryhub.replica import read_alias
from stacks.models import Stack

USDC_DECIMALS = 6
USDC_UNIT = 10**USDC_DECIMALS

# Tiers in order: an upgrade goes right, a downgrade left. "unlimited" (operators) is above all.
TIER_ORDER = ("free", "core", "pro", "enterprise", "unlimited")
# The tiers paid here, in USDC, per month (enterprise is a contract), and their prices in base units.
PAID_TIERS = (Subscription.Tier.CORE.value, Subscription.Tier.PRO.value)
PRICES = {Subscription.Tier.CORE.value: 5 * USDC_UNIT, Subscription.Tier.PRO.value: 15 * USDC_UNIT}


@dataclass(frozen=True)
class Overflow:
    """What a paid tier charges past its limits (per month) instead of refusing (§12.6-12.7)."""

    per_stack: int  # base units per syncing stack beyond the tier's count
    per_gb: int  # base units per started GB beyond the tier's storage


OVERFLOW = {"core": Overflow(per_stack=1_500_000, per_gb=500_000),
            "pro": Overflow(per_stack=1_000_000, per_gb=500_000)}


def usdc(amount: int) -> str:
    """Base units as a decimal USDC string without trailing zeros: 5_000_000 → "5", 1_500_000 → "1.5"."""
    value = Decimal(amount) / USDC_UNIT
    return format(value.normalize(), "f")


def tier_rank(name: str) -> int:
    return TIER_ORDER.index(name) if name in TIER_ORDER else len(TIER_ORDER)


# --- who ----------------------------------------------------------------------------------------


BILLING_ROLES = (Membership.Role.ADMIN, Membership.Role.BILLING)


def may_manage_billing(principal: Principal) -> bool:
    """THE billing rule: who may pay, link wallets, upgrade, downgrade, cancel and reactivate.

    People: the organization's admins and billing members. Keys act as the admin who issued them,
    so a writable school key may; an agent's key bound to one stack of a school may not (it may
    read, see `may_read_billing`) — except in a personal account, which the self-registered agent
    owns (§12.7: "register, then pay with USDC, then sync"). Read-only keys never manage."""
    if principal.api_key is not None:
        if principal.read_only:
            return False
        return principal.is_org_wide or principal.organization.kind == Organization.Kind.PERSONAL
    return principal.role in BILLING_ROLES


def may_read_billing(principal: Principal) -> bool:
    """Reading the subscription, usage, payments and wallets: every key of the organization (an
    agent checks its plan before it syncs) and the people who manage billing; not teachers."""
    return principal.api_key is not None or principal.role in BILLING_ROLES


def ensure_may_manage_billing(principal: Principal) -> None:
    if not may_manage_billing(principal):
        message = ("This key may read the subscription but not manage billing."
                   if principal.api_key is not None else
                   "Only the organization's admins and billing members manage billing.")
        raise Forbidden(message, code="billing_manager_required")


def ensure_may_read_billing(principal: Principal) -> None:
    if not may_read_billing(principal):
        raise Forbidden("Only the organization's admins and billing members see billing.",
                        code="billing_manager_required")


def billing_contacts(organization: Organization) -> list[str]:
    """Email addresses of the people told about renewals, expiries and reverted payments."""
    emails = User.objects.filter(memberships__organization=organization,
                                 memberships__role__in=BILLING_ROLES).exclude(email="")
    return sorted(set(emails.values_list("email", flat=True)))


# --- what -----------------------------------------------------------------------------------------


def subscription_of(organization: Organization) -> Subscription | None:
    return Subscription.objects.filter(organization_id=organization.pk).first()


def effective_tier(organization: Organization) -> str:
    """The tier limits are read from (Organization.tier, which billing.services keeps in step with
    the subscription)."""
    return tier_for(organization).name


# The statuses in which a paid tier's overflow is billed rather than refused: active, or running
# out a cancelled period. In grace (the period is unpaid) and after expiry the hard limits apply.
OVERFLOW_STANDING = (Subscription.Status.ACTIVE, Subscription.Status.CANCELLED)


def overflow_tier_for(subscription: Subscription | None, *, organization_tier: str) -> str:
    """What `Organization.overflow_tier` must say for `subscription` with the organization on
    `organization_tier`: that tier if it has overflow prices and the subscription pays for it in good
    standing, else "" (hard limits). billing.services writes it whenever it writes the tier."""
    if (subscription is None or subscription.tier != organization_tier or subscription.tier not in OVERFLOW
            or subscription.status not in OVERFLOW_STANDING):
        return ""
    return subscription.tier


def overflow_allowed(organization: Organization) -> bool:
    """Does the organization pay for overflow instead of being refused at its limits (storage here,
    stacks in stacks.selectors.stack_room: the same field)? Only a paid tier with overflow prices
    whose subscription is in good standing (`overflow_tier_for`): the overflow is billed with the
    next renewal. A tier an operator set without a subscription, or a lapsed one in grace, keeps its
    hard limits."""
    return organization.tier in OVERFLOW and organization.overflow_billed


@dataclass(frozen=True)
class Usage:
    period: str
    storage_used: int
    storage_limit: int | None
    sync_count: int  # stacks that synced this calendar month: what "stacks that actually sync" means
    last_sync: datetime | None
    agents_used: int  # active stacks
    agents_limit: int | None

    def as_dict(self) -> dict[str, object]:
        return {"period": self.period, "storage_used": self.storage_used, "storage_limit": self.storage_limit,
                "sync_count": self.sync_count, "last_sync": self.last_sync.isoformat() if self.last_sync else None,
                "agents_used": self.agents_used, "agents_limit": self.agents_limit}


def usage_of(organization: Organization, *, now: datetime | None = None, alias: str | None = None) -> Usage:
    """One aggregate over the organization's stack counters (never a scan of its memories).

    For showing, it reads the replica when there is one (`read_alias()`, docs/production.md §4): a
    figure a moment old is fine on a usage page. What decides or charges (the renewal's overflow,
    `overflow_charge`) passes `alias=DEFAULT_DB_ALIAS`: the primary."""
    now = now or timezone.now()
    month_start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    tier = tier_for(organization)
    totals = Stack.objects.using(alias or read_alias()).filter(organization_id=organization.pk).aggregate(
        bytes=Sum("bytes_used"), active=Count("id", filter=Q(status=Stack.Status.ACTIVE)),
        synced=Count("id", filter=Q(last_sync_at__gte=month_start)), last_sync=Max("last_sync_at"))
    return Usage(period=now.strftime("%Y-%m"), storage_used=int(totals["bytes"] or 0),
                 storage_limit=tier.storage_bytes, sync_count=int(totals["synced"] or 0),
                 last_sync=totals["last_sync"], agents_used=int(totals["active"] or 0),
                 agents_limit=tier.syncing_stacks)


def overflow_charge(organization: Organization, *, tier: str, usage: Usage | None = None) -> int:
    """Base units the overflow beyond `tier`'s limits adds to a month (0 without overflow prices)."""
    prices = OVERFLOW.get(tier)
    limits = TIERS.get(tier)
    if prices is None or limits is None:
        return 0
    usage = usage or usage_of(organization, alias=DEFAULT_DB_ALIAS)  # billed: the primary's figures
    charge = 0
    if limits.syncing_stacks is not None:
        charge += max(0, usage.agents_used - limits.syncing_stacks) * prices.per_stack
    if limits.storage_bytes is not None:
        extra = max(0, usage.storage_used - limits.storage_bytes)
        charge += -(-extra // GB) * prices.per_gb  # every started GB
    return charge


def renewal_amount(organization: Organization, subscription: Subscription | None) -> int | None:
    """What the next period will cost (base units), overflow included; None when nothing renews."""
    if subscription is None or not subscription.auto_renew or subscription.status not in (
            Subscription.Status.ACTIVE, Subscription.Status.GRACE_PERIOD):
        return None
    tier = subscription.scheduled_tier or subscription.tier
    if tier not in PRICES:
        return None
    return PRICES[tier] + overflow_charge(organization, tier=tier)


def subscription_view(organization: Organization) -> dict[str, object]:
    """`subscription` of §12.8's GET /subscriptions/me. Without a row: the organization's tier,
    active, never paid."""
    subscription = subscription_of(organization)
    if subscription is None:
        return {"tier": effective_tier(organization), "status": Subscription.Status.ACTIVE, "starts_at": None,
                "renews_at": None, "cancelled_at": None, "auto_renew": False, "renewal_amount": None,
                "scheduled_tier": None}
    amount = renewal_amount(organization, subscription)

    def iso(value: datetime | None) -> str | None:
        return value.isoformat() if value else None

    return {"tier": subscription.tier, "status": subscription.status, "starts_at": iso(subscription.starts_at),
            "renews_at": iso(subscription.renews_at), "cancelled_at": iso(subscription.cancelled_at),
            "auto_renew": subscription.auto_renew, "renewal_amount": usdc(amount) if amount is not None else None,
            "scheduled_tier": subscription.scheduled_tier or None}


# --- payments and wallets -----------------------------------------------------------------------------

# §12.7 knows four payment statuses; ours are finer. The API shows §12.7's and the reason beside it.
API_PAYMENT_STATUS = {
    Payment.Status.PENDING: "pending",
    Payment.Status.PENDING_VERIFICATION: "pending",
    Payment.Status.CONFIRMED: "confirmed",
    Payment.Status.FAILED: "failed",
    Payment.Status.EXPIRED: "failed",
    Payment.Status.REVERTED: "failed",
}


def payments_of(principal: Principal) -> QuerySet[Payment]:
    """The payment history, newest first, for listing: from the replica when there is one (a list a
    moment old is fine; a single payment's state, `payment_for`, is read on the primary)."""
    ensure_may_read_billing(principal)
    return (Payment.objects.using(read_alias()).filter(organization_id=principal.organization.pk)
            .order_by("-created_at", "-pk"))


def payment_for(principal: Principal, payment_id: object) -> Payment:
    """The caller's organization's payment `payment_id`; another organization's is a 404."""
    if not isinstance(payment_id, str) or not payment_id.startswith("pay_") or len(payment_id) > 40:
        raise NotFound("Payment not found.", code="payment_not_found")
    payment = Payment.objects.filter(organization_id=principal.organization.pk, public_id=payment_id).first()
    if payment is None:
        raise NotFound("Payment not found.", code="payment_not_found")
    return payment


def wallets_of(organization: Organization) -> QuerySet[Wallet]:
    return Wallet.objects.filter(organization_id=organization.pk).order_by("linked_at", "pk")


def linked_addresses(organization: Organization) -> frozenset[str]:
    return frozenset(wallets_of(organization).values_list("address", flat=True))
