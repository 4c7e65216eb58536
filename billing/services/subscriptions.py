"""The subscription record and the tier it sets: activating a paid period, reverting one, and the
plan changes a school makes (downgrade, cancel, reactivate), with the helpers every billing write
shares (the package docstring has the rules; docs/billing.md §5).
"""

from __future__ import annotations

import calendar
import logging
import smtplib
from datetime import datetime
from typing import Any

from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone

from accounts.models import Organization
from accounts.principal import Principal
from accounts.services import audit_record
from billing.models import Payment, Subscription
from billing.selectors import (
    PAID_TIERS,
    billing_contacts,
    ensure_may_manage_billing,
    overflow_tier_for,
    tier_rank,
    usdc,
)
from memoryhub.errors import InvalidInput

logger = logging.getLogger(__name__)


def one_month_after(value: datetime) -> datetime:
    """The same day and time a month later, clipped to the month's last day (Jan 31 → Feb 28/29):
    billing periods are monthly (§12.7)."""
    year, month = divmod(value.month, 12)
    year, month = value.year + year, month + 1
    return value.replace(year=year, month=month, day=min(value.day, calendar.monthrange(year, month)[1]))


def current_time(now: datetime | None) -> datetime:
    """`now`, or the current time when None: every write takes a clock a test may set."""
    return now or timezone.now()


def audit(organization: Organization, action: str, *, principal: Principal | None = None, target_id: str = "",
          ip: str | None = None, **metadata: Any) -> None:
    audit_record(organization=organization, action=action, principal=principal, target_type="billing",
                 target_id=target_id, ip=ip, metadata=metadata)


def mail(organization: Organization, subject: str, body: str) -> None:
    """Tell the organization's admins and billing members, after the transaction commits (a rolled
    back change sends nothing). A mail that cannot be handed over is logged, never raised."""
    recipients = billing_contacts(organization)
    if not recipients:
        return

    def send() -> None:
        try:
            send_mail(f"MemoryHub billing: {subject}", body, None, recipients, fail_silently=False)
        except (OSError, smtplib.SMTPException) as error:
            logger.warning("billing email for organization %s not sent: %s", organization.pk, type(error).__name__)

    transaction.on_commit(send)


def set_org_tier(organization: Organization, tier: str, subscription: Subscription) -> None:
    """Move the organization's limits to `tier` and, beside it, whether its overflow is billed
    (`Organization.overflow_tier`, which stacks.selectors reads for the stack quota: stacks sit
    below billing and cannot ask the subscription). Every change of the subscription's tier or
    standing comes through here, in the same transaction."""
    overflow = overflow_tier_for(subscription, organization_tier=tier)
    organization.tier, organization.overflow_tier = tier, overflow
    # save(), not QuerySet.update(): its post_save tells every web process's key cache that what the
    # school's keys grant has changed (accounts/key_cache.py), so the new limits apply at once.
    organization.save(update_fields=["tier", "overflow_tier"])


def locked_subscription(organization: Organization) -> Subscription:
    """The organization's subscription row, locked (created on first use, on its current tier)."""
    Subscription.objects.get_or_create(organization=organization,
                                       defaults={"tier": organization.tier if organization.tier in
                                                 Subscription.Tier.values else Subscription.Tier.FREE})
    return Subscription.objects.select_for_update().get(organization=organization)


def current_tier(organization: Organization) -> str:
    subscription = Subscription.objects.filter(organization_id=organization.pk).first()
    if subscription is not None and subscription.status != Subscription.Status.EXPIRED:
        return subscription.tier
    return organization.tier


# --- a paid period: activating it, reverting it ------------------------------------------------------


def _snapshot(subscription: Subscription, organization: Organization) -> dict[str, Any]:
    def iso(value: datetime | None) -> str | None:
        return value.isoformat() if value else None

    return {"tier": subscription.tier, "status": subscription.status, "starts_at": iso(subscription.starts_at),
            "renews_at": iso(subscription.renews_at), "cancelled_at": iso(subscription.cancelled_at),
            "auto_renew": subscription.auto_renew, "scheduled_tier": subscription.scheduled_tier,
            "warned_at": iso(subscription.warned_at), "organization_tier": organization.tier}


def _restore(subscription: Subscription, snapshot: dict[str, Any]) -> None:
    def parse(value: str | None) -> datetime | None:
        return datetime.fromisoformat(value) if value else None

    subscription.tier = snapshot["tier"]
    subscription.status = snapshot["status"]
    subscription.starts_at = parse(snapshot["starts_at"])
    subscription.renews_at = parse(snapshot["renews_at"])
    subscription.cancelled_at = parse(snapshot["cancelled_at"])
    subscription.auto_renew = snapshot["auto_renew"]
    subscription.scheduled_tier = snapshot["scheduled_tier"]
    subscription.warned_at = parse(snapshot["warned_at"])
    subscription.save()


def activate(payment: Payment, *, now: datetime, principal: Principal | None = None, ip: str | None = None) -> None:
    """A confirmed transfer: start the paid month and raise the limits, in one transaction. A
    renewal continues the period it renews (from `renews_at`, grace days included); an upgrade
    starts a new month now (no proration)."""
    organization = payment.organization
    subscription = locked_subscription(organization)
    previous = _snapshot(subscription, organization)
    if (payment.kind == Payment.Kind.RENEWAL and subscription.renews_at is not None
            and subscription.status in (Subscription.Status.ACTIVE, Subscription.Status.GRACE_PERIOD)):
        start = subscription.renews_at
    else:
        start = now
    end = one_month_after(start)
    subscription.tier = payment.tier
    subscription.status = Subscription.Status.ACTIVE
    subscription.starts_at = start
    subscription.renews_at = end
    subscription.cancelled_at = None
    subscription.auto_renew = True
    subscription.scheduled_tier = ""
    subscription.warned_at = None
    subscription.save()
    set_org_tier(organization, payment.tier, subscription)
    payment.status = Payment.Status.CONFIRMED
    payment.confirmed_at = now
    payment.period_start = start
    payment.period_end = end
    payment.previous_subscription = previous
    payment.save(update_fields=["status", "confirmed_at", "period_start", "period_end", "previous_subscription"])
    # Other open intents are moot now (an upgrade intent for a tier the school just passed). One
    # that a concurrent confirm holds locked is skipped, never waited for: that confirm is waiting
    # on this transaction's claim (the UNIQUE index) and waiting back would deadlock. It loses its
    # claim to the constraint anyway; unpaid, it expires with its 24 hours.
    moot = Payment.objects.select_for_update(skip_locked=True).filter(
        organization=organization, status=Payment.Status.PENDING).exclude(pk=payment.pk).values_list("pk", flat=True)
    Payment.objects.filter(pk__in=list(moot)).update(status=Payment.Status.EXPIRED, failure_reason="superseded")
    audit(organization, "billing.payment_confirmed", principal=principal, target_id=payment.public_id, ip=ip,
          tier=payment.tier, amount=payment.amount, tx_hash=payment.tx_hash, period_end=end.isoformat())


def revert(payment: Payment, *, now: datetime, reason: str) -> None:
    organization = payment.organization
    subscription = locked_subscription(organization)
    if payment.previous_subscription:
        _restore(subscription, payment.previous_subscription)
        set_org_tier(organization, payment.previous_subscription["organization_tier"], subscription)
    payment.status = Payment.Status.REVERTED
    payment.failure_reason = reason[:64]
    payment.save(update_fields=["status", "failure_reason"])
    audit(organization, "billing.payment_reverted", target_id=payment.public_id, reason=reason,
          tx_hash=payment.tx_hash, tier=payment.tier)
    mail(organization, "a payment was reverted",
          f"The USDC transfer {payment.tx_hash} that paid for {payment.tier} ({usdc(payment.amount)} USDC) was "
          f"removed from the chain by a reorganisation before it was final, so {organization.name} is back on "
          f"{subscription.tier}. If the transfer is mined again you can confirm it with a new upgrade; otherwise "
          "please send the payment again.")


# --- downgrade, cancel, reactivate --------------------------------------------------------------------


def _managed_subscription(principal: Principal) -> Subscription:
    """The caller's organization's subscription, locked, once the caller may manage billing."""
    ensure_may_manage_billing(principal)
    return locked_subscription(principal.organization)


def withdraw_renewal_intents(organization: Organization, *, reason: str) -> None:
    """Close the open renewal intent (if any): the period it would pay will not come as priced."""
    Payment.objects.filter(organization=organization, kind=Payment.Kind.RENEWAL,
                           status=Payment.Status.PENDING).update(status=Payment.Status.EXPIRED,
                                                                 failure_reason=reason)


def _set_renewing(subscription: Subscription, *, renewing: bool, now: datetime) -> None:
    """Cancel (renewing=False) or reactivate: the tier stays until `renews_at` either way, and so
    does the overflow billing (a cancelled period is still paid: billing.selectors.OVERFLOW_STANDING)."""
    subscription.status = Subscription.Status.ACTIVE if renewing else Subscription.Status.CANCELLED
    subscription.cancelled_at = None if renewing else now
    subscription.auto_renew = renewing
    subscription.save(update_fields=["status", "cancelled_at", "auto_renew", "updated_at"])


@transaction.atomic
def downgrade(*, principal: Principal, tier: str, ip: str | None = None,
              now: datetime | None = None) -> Subscription:
    """Schedule a lower tier for the end of the paid period (§12.8)."""
    subscription = _managed_subscription(principal)
    if subscription.tier not in PAID_TIERS or subscription.status == Subscription.Status.EXPIRED:
        raise InvalidInput("Only a paid subscription can be downgraded.", code="not_downgradable")
    if tier not in ("free", *PAID_TIERS) or tier_rank(tier) >= tier_rank(subscription.tier):
        raise InvalidInput(f"A downgrade must be to a tier below {subscription.tier}.", code="not_a_downgrade",
                           fields={"tier": [f"lower than {subscription.tier}"]})
    subscription.scheduled_tier = tier
    if subscription.warned_at is not None:
        # A renewal intent for the old tier may be open: withdraw it; the next lifecycle run opens
        # one for the new tier and warns again.
        withdraw_renewal_intents(principal.organization, reason="superseded")
        subscription.warned_at = None
    subscription.save(update_fields=["scheduled_tier", "warned_at", "updated_at"])
    audit(principal.organization, "billing.downgrade_scheduled", principal=principal, ip=ip, tier=tier,
          effective_at=subscription.renews_at.isoformat() if subscription.renews_at else None)
    return subscription


@transaction.atomic
def cancel(*, principal: Principal, ip: str | None = None, now: datetime | None = None) -> Subscription:
    """Stop renewing: the tier stays until the end of the paid period, then the school is on free."""
    subscription = _managed_subscription(principal)
    if subscription.tier not in PAID_TIERS or subscription.status != Subscription.Status.ACTIVE:
        raise InvalidInput("Only an active paid subscription can be cancelled.", code="not_cancellable")
    _set_renewing(subscription, renewing=False, now=current_time(now))
    withdraw_renewal_intents(principal.organization, reason="cancelled")
    audit(principal.organization, "billing.cancelled", principal=principal, ip=ip,
          active_until=subscription.renews_at.isoformat() if subscription.renews_at else None)
    return subscription


@transaction.atomic
def reactivate(*, principal: Principal, ip: str | None = None, now: datetime | None = None) -> Subscription:
    """Undo a cancellation before the paid period ends."""
    now = current_time(now)
    subscription = _managed_subscription(principal)
    if (subscription.status != Subscription.Status.CANCELLED or subscription.renews_at is None
            or subscription.renews_at <= now):
        raise InvalidInput("Only a cancelled subscription whose period has not ended can be reactivated.",
                           code="not_reactivatable")
    _set_renewing(subscription, renewing=True, now=now)
    audit(principal.organization, "billing.reactivated", principal=principal, ip=ip)
    return subscription
