"""The daily lifecycle: renewal warnings (opening the renewal intent), grace for an unpaid
period, the move to free, the end of cancelled periods, scheduled downgrades, and expiring unpaid
intents (docs/billing.md §5).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction

from billing.models import Payment, Subscription
from billing.selectors import PAID_TIERS, PRICES, overflow_charge, usdc
from billing.services.subscriptions import audit, current_time, mail, set_org_tier, withdraw_renewal_intents

GRACE_PERIOD = timedelta(days=7)
RENEWAL_WARNING = timedelta(days=3)


def _open_renewal(subscription: Subscription, *, now: datetime) -> Payment | None:
    """The renewal intent for the period after `renews_at` (the scheduled tier if a paid downgrade
    waits), priced with the overflow the organization uses now. Open until grace ends."""
    tier = subscription.scheduled_tier or subscription.tier
    if tier not in PRICES or subscription.renews_at is None:
        return None
    organization = subscription.organization
    existing = Payment.objects.filter(organization=organization, kind=Payment.Kind.RENEWAL,
                                      status__in=(Payment.Status.PENDING, *Payment.CLAIMED), tier=tier).first()
    if existing is not None:
        return existing
    return Payment.objects.create(organization=organization, kind=Payment.Kind.RENEWAL, tier=tier,
                                  amount=PRICES[tier] + overflow_charge(organization, tier=tier), created_at=now,
                                  expires_at=subscription.renews_at + GRACE_PERIOD)


@dataclass
class LifecycleReport:
    warned: int = 0
    grace: int = 0
    expired: int = 0
    downgraded: int = 0
    intents_expired: int = 0


def lifecycle_run(*, now: datetime | None = None) -> LifecycleReport:
    """Warn 3 days before renewal (opening the renewal intent), move an unpaid period into 7 days
    of grace and then to free, end cancelled periods, and apply scheduled downgrades."""
    now = current_time(now)
    report = LifecycleReport()
    report.intents_expired = expire_intents(now=now)
    due = Subscription.objects.filter(tier__in=PAID_TIERS, renews_at__isnull=False).exclude(
        status=Subscription.Status.EXPIRED).values_list("pk", flat=True)
    for pk in due:
        with transaction.atomic():
            subscription = Subscription.objects.select_for_update().select_related("organization").get(pk=pk)
            _lifecycle_step(subscription, now=now, report=report)
    return report


def _lifecycle_step(subscription: Subscription, *, now: datetime, report: LifecycleReport) -> None:
    organization = subscription.organization
    renews_at = subscription.renews_at
    assert renews_at is not None
    status = subscription.status
    if status == Subscription.Status.ACTIVE and renews_at - RENEWAL_WARNING <= now < renews_at \
            and subscription.warned_at is None:
        _warn(subscription, now=now)
        report.warned += 1
    elif status == Subscription.Status.CANCELLED and renews_at <= now:
        _to_free(subscription, status=Subscription.Status.EXPIRED)
        audit(organization, "billing.period_ended", tier="free")
        report.expired += 1
    elif status == Subscription.Status.ACTIVE and renews_at <= now:
        scheduled = subscription.scheduled_tier
        if scheduled == "free":
            _to_free(subscription, status=Subscription.Status.ACTIVE)
            audit(organization, "billing.downgraded", tier="free")
            report.downgraded += 1
            return
        if scheduled:
            subscription.tier = scheduled
            subscription.scheduled_tier = ""
            audit(organization, "billing.downgraded", tier=scheduled)
            report.downgraded += 1
        # Not paid for the next period (a paid renewal would have moved renews_at on): grace. The
        # tier's limits stay, but overflow is no longer billed: new stacks and bytes past them are
        # refused until the renewal is paid.
        subscription.status = Subscription.Status.GRACE_PERIOD
        subscription.save()
        set_org_tier(organization, scheduled or organization.tier, subscription)
        _open_renewal(subscription, now=now)
        audit(organization, "billing.grace_started", tier=subscription.tier,
              grace_until=(renews_at + GRACE_PERIOD).isoformat())
        mail(organization, "payment overdue",
              f"{organization.name}'s {subscription.tier} plan was due for renewal on {renews_at:%Y-%m-%d}. "
              f"It stays active for a grace period until {renews_at + GRACE_PERIOD:%Y-%m-%d}; pay the renewal on "
              "the dashboard's Billing page before then, or the school moves to the free tier.")
        report.grace += 1
    elif status == Subscription.Status.GRACE_PERIOD and renews_at + GRACE_PERIOD <= now:
        _to_free(subscription, status=Subscription.Status.EXPIRED)
        withdraw_renewal_intents(organization, reason="expired")
        audit(organization, "billing.expired", tier="free")
        mail(organization, "plan expired",
              f"{organization.name}'s plan was not renewed within the grace period and is now the free tier "
              "(10 MB, 1 syncing stack). Existing memories can still be read and deleted; writes beyond the "
              "free limits are refused until you upgrade again.")
        report.expired += 1


def _warn(subscription: Subscription, *, now: datetime) -> None:
    organization = subscription.organization
    renews_at = subscription.renews_at
    assert renews_at is not None
    subscription.warned_at = now
    subscription.save(update_fields=["warned_at", "updated_at"])
    if subscription.scheduled_tier == "free":
        body = (f"{organization.name}'s {subscription.tier} plan ends on {renews_at:%Y-%m-%d} as scheduled; "
                "the school then moves to the free tier.")
    else:
        renewal = _open_renewal(subscription, now=now)
        assert renewal is not None
        body = (f"{organization.name}'s plan renews on {renews_at:%Y-%m-%d}: {usdc(renewal.amount)} USDC for "
                f"{renewal.tier} (payment {renewal.public_id}, overflow included). Send it from a linked wallet "
                "to the treasury shown on the dashboard's Billing page; it is matched automatically.")
    audit(organization, "billing.renewal_warned", renews_at=renews_at.isoformat())
    mail(organization, "renewal in 3 days", body)


def _to_free(subscription: Subscription, *, status: str) -> None:
    subscription.tier = Subscription.Tier.FREE
    subscription.status = status
    subscription.scheduled_tier = ""
    subscription.auto_renew = False
    subscription.starts_at = None
    subscription.renews_at = None
    subscription.warned_at = None
    subscription.save()
    set_org_tier(subscription.organization, Subscription.Tier.FREE, subscription)


def expire_intents(*, now: datetime | None = None) -> int:
    """Close open intents nobody paid in time."""
    return Payment.objects.filter(status=Payment.Status.PENDING, expires_at__lte=current_time(now)).update(
        status=Payment.Status.EXPIRED, failure_reason="expired")
