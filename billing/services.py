"""Every billing write: payment intents, claiming and confirming transfers, activating and lapsing
tiers, downgrades, cancellations, the treasury watcher and the daily lifecycle
(docs/kernle-protocol.md §12.7-12.8; docs/billing.md).

Money moves a tier only through `_activate`, and only for a transfer that billing.chain says is
final enough (PAYMENT_CONFIRMATIONS), correctly addressed, of the exact amount, from a wallet the
organization linked, and mined after the intent was created. One transfer pays once: the claim is
a conditional UPDATE under the payment's row lock, backed by the partial UNIQUE constraint on
(chain_id, tx_hash, log_index), so two concurrent confirms cannot both win.

`Organization.tier` is the tier every limit reads (accounts.tiers); these services change it in
the same transaction as the subscription, so limits and subscription never disagree.

Every function takes `now` (default: timezone.now()) so the lifecycle can run on a test's clock.
"""

from __future__ import annotations

import calendar
import logging
import smtplib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from accounts.models import Organization
from accounts.principal import Principal
from accounts.services import audit_record
from billing import chain
from billing.models import ChainCursor, Payment, Subscription
from billing.selectors import (
    PAID_TIERS,
    PRICES,
    billing_contacts,
    ensure_may_manage_billing,
    linked_addresses,
    overflow_charge,
    overflow_tier_for,
    tier_rank,
    usdc,
)
from memoryhub.errors import BillingUnavailable, Conflict, InvalidInput
from memoryhub.metrics import PAYMENT_VERIFICATIONS

logger = logging.getLogger(__name__)

INTENT_LIFETIME = timedelta(hours=24)
GRACE_PERIOD = timedelta(days=7)
RENEWAL_WARNING = timedelta(days=3)


def one_month_after(value: datetime) -> datetime:
    """The same day and time a month later, clipped to the month's last day (Jan 31 → Feb 28/29):
    billing periods are monthly (§12.7)."""
    year, month = divmod(value.month, 12)
    year, month = value.year + year, month + 1
    return value.replace(year=year, month=month, day=min(value.day, calendar.monthrange(year, month)[1]))


def _now(now: datetime | None) -> datetime:
    return now or timezone.now()


def _audit(organization: Organization, action: str, *, principal: Principal | None = None, target_id: str = "",
           ip: str | None = None, **metadata: Any) -> None:
    audit_record(organization=organization, action=action, principal=principal, target_type="billing",
                 target_id=target_id, ip=ip, metadata=metadata)


def _mail(organization: Organization, subject: str, body: str) -> None:
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


def _set_org_tier(organization: Organization, tier: str, subscription: Subscription) -> None:
    """Move the organization's limits to `tier` and, beside it, whether its overflow is billed
    (`Organization.overflow_tier`, which stacks.selectors reads for the stack quota: stacks sit
    below billing and cannot ask the subscription). Every change of the subscription's tier or
    standing comes through here, in the same transaction."""
    overflow = overflow_tier_for(subscription, organization_tier=tier)
    organization.tier, organization.overflow_tier = tier, overflow
    # save(), not QuerySet.update(): its post_save tells every web process's key cache that what the
    # school's keys grant has changed (accounts/key_cache.py), so the new limits apply at once.
    organization.save(update_fields=["tier", "overflow_tier"])


def _locked_subscription(organization: Organization) -> Subscription:
    """The organization's subscription row, locked (created on first use, on its current tier)."""
    Subscription.objects.get_or_create(organization=organization,
                                       defaults={"tier": organization.tier if organization.tier in
                                                 Subscription.Tier.values else Subscription.Tier.FREE})
    return Subscription.objects.select_for_update().get(organization=organization)


def _current_tier(organization: Organization) -> str:
    subscription = Subscription.objects.filter(organization_id=organization.pk).first()
    if subscription is not None and subscription.status != Subscription.Status.EXPIRED:
        return subscription.tier
    return organization.tier


# --- intents ------------------------------------------------------------------------------------


def payment_link(payment: Payment, config: chain.ChainConfig) -> str:
    """EIP-681 link a wallet app opens as "send `amount` USDC to the treasury" (a QR code of it)."""
    return (f"ethereum:{config.usdc_contract}@{config.chain_id}/transfer"
            f"?address={config.treasury}&uint256={payment.amount}")


def chain_name(chain_id: int) -> str:
    return {8453: "base", 84532: "base-sepolia", 31337: "anvil"}.get(chain_id, f"eip155:{chain_id}")


@transaction.atomic
def upgrade(*, principal: Principal, tier: str, ip: str | None = None, now: datetime | None = None) -> Payment:
    """Open a 24-hour payment intent for a higher paid tier (§12.8). 400 for free, enterprise
    (a contract, not a payment), an unknown tier, or the same or a lower tier than the current."""
    _ensure_upgradable(principal, tier)
    now = _now(now)
    organization = principal.organization
    payment = Payment.objects.create(organization=organization, created_by=principal.user, kind=Payment.Kind.UPGRADE,
                                     tier=tier, amount=PRICES[tier], created_at=now,
                                     expires_at=now + INTENT_LIFETIME)
    _audit(organization, "billing.intent_created", principal=principal, target_id=payment.public_id, ip=ip,
           tier=tier, amount=payment.amount)
    return payment


def _ensure_upgradable(principal: Principal, tier: str) -> None:
    """The checks before any upgrade intent (by transfer or by x402): who, which tier, and a chain
    and treasury to pay on."""
    ensure_may_manage_billing(principal)
    if tier not in PAID_TIERS:
        message = ("Enterprise is arranged by contract, not paid here." if tier == Subscription.Tier.ENTERPRISE
                   else "Upgrade to core or pro.")
        raise InvalidInput(message, code="invalid_tier", fields={"tier": ["core or pro"]})
    organization = principal.organization
    current = _current_tier(organization)
    if tier_rank(tier) <= tier_rank(current):
        raise InvalidInput(f"Already on {current}; an upgrade must be to a higher tier (downgrades take effect"
                           " at the end of the period: POST /api/v1/subscriptions/downgrade).",
                           code="not_an_upgrade", fields={"tier": [f"higher than {current}"]})
    chain.chain_config()  # no chain or no treasury configured: 503, never an intent nobody can pay


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


# --- claiming and confirming a transfer -----------------------------------------------------------


@dataclass(frozen=True)
class ConfirmResult:
    payment: Payment
    status: str  # "confirmed" | "pending_verification" | "failed"
    reason: str | None
    message: str


def confirm(*, principal: Principal, payment: Payment, tx_hash: str, ip: str | None = None,
            now: datetime | None = None) -> ConfirmResult:
    """POST /subscriptions/payments/confirm: check `tx_hash` on the chain and claim it for
    `payment` (which the caller's organization owns: billing.selectors.payment_for).

    A transfer that fails a check leaves the intent open (it may still be paid until it expires)
    and answers `failed` with the reason; one with too few confirmations is claimed and answers
    `pending_verification` (billing.tasks re-checks it, and so does a repeated confirm)."""
    ensure_may_manage_billing(principal)
    now = _now(now)
    if payment.status == Payment.Status.CONFIRMED:
        raise InvalidInput("This payment is already confirmed.", code="payment_already_confirmed")
    if payment.status in (Payment.Status.EXPIRED, Payment.Status.FAILED, Payment.Status.REVERTED):
        raise InvalidInput(f"This payment is {payment.status}; start a new upgrade.", code=f"payment_{payment.status}")
    if payment.status == Payment.Status.PENDING and payment.expires_at <= now:
        raise InvalidInput("This payment intent has expired; start a new upgrade.", code="payment_expired")
    if payment.status == Payment.Status.PENDING_VERIFICATION and (payment.tx_hash or "") != tx_hash.lower():
        raise Conflict("Another transfer is already being verified for this payment.", code="payment_claimed")
    return claim_transfer(payment=payment, tx_hash=tx_hash, principal=principal, ip=ip, now=now)


def claim_transfer(*, payment: Payment, tx_hash: str, principal: Principal | None = None, ip: str | None = None,
                   now: datetime | None = None) -> ConfirmResult:
    """Verify `tx_hash` for `payment` and claim it: the one path of the confirm route and the
    treasury watcher. The chain is asked before any lock is taken (no row lock is held across an
    RPC); the claim itself re-reads the payment under its row lock."""
    now = _now(now)
    senders = linked_addresses(payment.organization)
    if payment.from_address:  # a claimed transfer stays its sender's even if that wallet is unlinked since
        senders = senders | {payment.from_address}
    check = chain.inspect_transfer(tx_hash, expected_amount=payment.amount, expected_from=set(senders),
                                   not_before=payment.created_at)
    PAYMENT_VERIFICATIONS.labels(check.status).inc()
    if check.status == "failed" or (check.status == "pending" and check.reason == "not_mined"):
        reason = check.reason or "failed"
        Payment.objects.filter(pk=payment.pk, status=Payment.Status.PENDING).update(failure_reason=reason[:64])
        payment.failure_reason = reason[:64]
        if check.status == "pending":
            return ConfirmResult(payment, "pending_verification", reason, check.message)
        _audit(payment.organization, "billing.transfer_refused", principal=principal, target_id=payment.public_id,
               ip=ip, reason=reason, tx_hash=check.tx_hash or tx_hash.lower()[:66])
        return ConfirmResult(payment, "failed", reason, check.message)
    with transaction.atomic():
        locked = Payment.objects.select_for_update().select_related("organization").get(pk=payment.pk)
        same = (locked.chain_id == check.chain_id and locked.tx_hash == check.tx_hash
                and locked.log_index == check.log_index)
        if locked.status == Payment.Status.CONFIRMED:
            raise InvalidInput("This payment is already confirmed.", code="payment_already_confirmed")
        if locked.status == Payment.Status.PENDING_VERIFICATION and not same:
            raise Conflict("Another transfer is already being verified for this payment.", code="payment_claimed")
        if locked.status not in (Payment.Status.PENDING, Payment.Status.PENDING_VERIFICATION):
            raise InvalidInput(f"This payment is {locked.status}; start a new upgrade.",
                               code=f"payment_{locked.status}")
        if locked.status == Payment.Status.PENDING:
            if locked.expires_at <= now:
                raise InvalidInput("This payment intent has expired; start a new upgrade.", code="payment_expired")
            _claim(locked, check, now=now)
        if check.status == "confirmed":
            _activate(locked, now=now, principal=principal, ip=ip)
            return ConfirmResult(locked, "confirmed", None, f"Payment confirmed: {locked.tier} is active.")
        Payment.objects.filter(pk=locked.pk).update(block_number=check.block_number, block_hash=check.block_hash or "")
    return ConfirmResult(locked, "pending_verification", check.reason,
                         f"Transfer found with {check.confirmations} of {chain.chain_config().confirmations} "
                         "confirmations; it is re-checked until confirmed. Retry later.")


def _claim(payment: Payment, check: chain.TransferCheck, *, now: datetime) -> None:
    """Mark the transfer as this payment's. The partial UNIQUE constraint refuses a transfer
    another payment claimed (or is claiming in a concurrent transaction: it waits for that one)."""
    payment.chain_id = check.chain_id
    payment.tx_hash = check.tx_hash
    payment.log_index = check.log_index
    payment.from_address = check.sender or ""
    payment.to_address = check.recipient or ""
    payment.block_number = check.block_number
    payment.block_hash = check.block_hash or ""
    payment.claimed_at = now
    payment.failure_reason = ""
    payment.status = Payment.Status.PENDING_VERIFICATION
    try:
        with transaction.atomic():
            payment.save(update_fields=["chain_id", "tx_hash", "log_index", "from_address", "to_address",
                                        "block_number", "block_hash", "claimed_at", "failure_reason", "status"])
    except IntegrityError:
        raise Conflict("This transfer has already paid another payment.", code="transfer_already_claimed") from None


# --- x402: an agent pays with a signed authorization that we settle ourselves ---------------------


def x402_offer(*, principal: Principal, tier: str) -> int:
    """The price an x402 upgrade asks for (base units), after every check an upgrade makes; no
    intent yet: the 402 answer is a quote, the intent opens when the signed payment arrives."""
    _ensure_upgradable(principal, tier)
    if not chain.chain_config().relayer_key:
        raise BillingUnavailable("x402 payments are not configured on this server (no CHAIN_RELAYER_KEY).")
    return PRICES[tier]


@dataclass(frozen=True)
class X402Result:
    confirm: ConfirmResult
    tx_hash: str
    payer: str


def x402_pay(*, principal: Principal, tier: str, payment_header: str, ip: str | None = None,
             now: datetime | None = None) -> X402Result:
    """Upgrade paid with an x402 `exact` authorization: check it completely (billing.chain:
    signature, recipient, amount, linked sender, validity and nonce), then open the intent, have
    our relayer submit the authorization, and claim the settled transfer exactly as a pasted hash
    is claimed (`claim_transfer`: pending_verification until PAYMENT_CONFIRMATIONS, then the tier).

    Nothing is stored before the authorization passed its checks: a header that is no payment, or
    a signature that is no signature (0x00…00), is a 400 and a node outage a 503, with no intent
    left behind. An authorization refused by a check is recorded as a `failed` intent with the
    reason (docs/billing.md §4), created failed in one transaction: it is never pending. The intent
    of an authorization that passed is committed before it is submitted, so the transfer's block is
    never older than the intent (billing.chain's before_intent); the token refusing it at
    submission fails that intent the same way. Nothing is sent or activated for a refusal."""
    decoded = chain.x402_decode_payment(payment_header)  # malformed: 400 before anything is stored
    _ensure_upgradable(principal, tier)
    try:
        checked = chain.x402_check(decoded.authorization, decoded.signature, expected_amount=PRICES[tier],
                                   expected_from=linked_addresses(principal.organization))
    except chain.SettlementRefused as refused:
        with transaction.atomic():
            _x402_refused(upgrade(principal=principal, tier=tier, ip=ip, now=now), refused, principal=principal,
                          ip=ip)
        raise
    payment = upgrade(principal=principal, tier=tier, ip=ip, now=now)
    try:
        tx_hash = chain.x402_submit(checked)
    except chain.SettlementRefused as refused:
        _x402_refused(payment, refused, principal=principal, ip=ip)
        raise
    # Settled (or submitted and not yet mined: the claim then answers pending and the re-check
    # task, or a confirm with this hash, carries on). Should the chain fail after submitting, the
    # intent stays open and the treasury watcher matches the transfer to it.
    result = claim_transfer(payment=payment, tx_hash=tx_hash, principal=principal, ip=ip, now=now)
    return X402Result(confirm=result, tx_hash=tx_hash, payer=decoded.payer)


def _x402_refused(payment: Payment, refused: chain.SettlementRefused, *, principal: Principal,
                  ip: str | None) -> None:
    Payment.objects.filter(pk=payment.pk, status=Payment.Status.PENDING).update(
        status=Payment.Status.FAILED, failure_reason=f"x402_{refused.reason}"[:64])
    _audit(payment.organization, "billing.transfer_refused", principal=principal, target_id=payment.public_id,
           ip=ip, reason=refused.reason, method="x402")


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


def _activate(payment: Payment, *, now: datetime, principal: Principal | None = None, ip: str | None = None) -> None:
    """A confirmed transfer: start the paid month and raise the limits, in one transaction. A
    renewal continues the period it renews (from `renews_at`, grace days included); an upgrade
    starts a new month now (no proration)."""
    organization = payment.organization
    subscription = _locked_subscription(organization)
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
    _set_org_tier(organization, payment.tier, subscription)
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
    _audit(organization, "billing.payment_confirmed", principal=principal, target_id=payment.public_id, ip=ip,
           tier=payment.tier, amount=payment.amount, tx_hash=payment.tx_hash, period_end=end.isoformat())


def recheck(payment: Payment, *, now: datetime | None = None) -> str:
    """One re-check of a claimed transfer (billing.tasks): confirm it once deep enough, drop the
    claim if it vanished before confirmation, revert the activation if a reorg removed it before
    finality, and mark it final. Returns the payment's status afterwards."""
    now = _now(now)
    config = chain.chain_config()
    check = chain.inspect_transfer(payment.tx_hash or "", expected_amount=payment.amount,
                                   expected_from={payment.from_address}, not_before=payment.created_at)
    PAYMENT_VERIFICATIONS.labels(check.status).inc()
    gone = check.status == "failed" or check.reason == "not_mined"
    with transaction.atomic():
        locked = Payment.objects.select_for_update().select_related("organization").get(pk=payment.pk)
        if locked.status == Payment.Status.PENDING_VERIFICATION:
            if gone:
                locked.status = Payment.Status.FAILED
                locked.failure_reason = "transfer_dropped" if check.reason in ("unknown_tx", "not_mined") \
                    else (check.reason or "failed")[:64]
                locked.save(update_fields=["status", "failure_reason"])
                _audit(locked.organization, "billing.transfer_dropped", target_id=locked.public_id,
                       reason=locked.failure_reason)
            elif check.status == "confirmed":
                _activate(locked, now=now)
        elif locked.status == Payment.Status.CONFIRMED and locked.finalized_at is None:
            if gone:
                _revert(locked, now=now, reason="reorg" if check.reason in ("unknown_tx", "not_mined")
                        else (check.reason or "failed"))
            elif check.confirmations >= finality_confirmations(config):
                locked.finalized_at = now
                locked.block_number, locked.block_hash = check.block_number, check.block_hash or ""
                locked.save(update_fields=["finalized_at", "block_number", "block_hash"])
        return locked.status


def recheck_claimed(*, now: datetime | None = None) -> dict[str, int]:
    """Re-check every claimed transfer that is not final yet (billing.tasks, every few seconds)."""
    counts: dict[str, int] = {}
    claimed = Payment.objects.filter(
        Q(status=Payment.Status.PENDING_VERIFICATION) | Q(status=Payment.Status.CONFIRMED, finalized_at__isnull=True)
    ).select_related("organization").order_by("claimed_at")
    for payment in claimed:
        status = recheck(payment, now=now)
        counts[status] = counts.get(status, 0) + 1
    return counts


def finality_confirmations(config: chain.ChainConfig) -> int:
    """Depth after which a confirmed payment is no longer watched for reorgs."""
    return settings.PAYMENT_FINALITY_CONFIRMATIONS or 2 * config.confirmations


def _revert(payment: Payment, *, now: datetime, reason: str) -> None:
    organization = payment.organization
    subscription = _locked_subscription(organization)
    if payment.previous_subscription:
        _restore(subscription, payment.previous_subscription)
        _set_org_tier(organization, payment.previous_subscription["organization_tier"], subscription)
    payment.status = Payment.Status.REVERTED
    payment.failure_reason = reason[:64]
    payment.save(update_fields=["status", "failure_reason"])
    _audit(organization, "billing.payment_reverted", target_id=payment.public_id, reason=reason,
           tx_hash=payment.tx_hash, tier=payment.tier)
    _mail(organization, "a payment was reverted",
          f"The USDC transfer {payment.tx_hash} that paid for {payment.tier} ({usdc(payment.amount)} USDC) was "
          f"removed from the chain by a reorganisation before it was final, so {organization.name} is back on "
          f"{subscription.tier}. If the transfer is mined again you can confirm it with a new upgrade; otherwise "
          "please send the payment again.")


# --- downgrade, cancel, reactivate --------------------------------------------------------------------


def _managed_subscription(principal: Principal) -> Subscription:
    """The caller's organization's subscription, locked, once the caller may manage billing."""
    ensure_may_manage_billing(principal)
    return _locked_subscription(principal.organization)


def _withdraw_renewal_intents(organization: Organization, *, reason: str) -> None:
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
        _withdraw_renewal_intents(principal.organization, reason="superseded")
        subscription.warned_at = None
    subscription.save(update_fields=["scheduled_tier", "warned_at", "updated_at"])
    _audit(principal.organization, "billing.downgrade_scheduled", principal=principal, ip=ip, tier=tier,
           effective_at=subscription.renews_at.isoformat() if subscription.renews_at else None)
    return subscription


@transaction.atomic
def cancel(*, principal: Principal, ip: str | None = None, now: datetime | None = None) -> Subscription:
    """Stop renewing: the tier stays until the end of the paid period, then the school is on free."""
    subscription = _managed_subscription(principal)
    if subscription.tier not in PAID_TIERS or subscription.status != Subscription.Status.ACTIVE:
        raise InvalidInput("Only an active paid subscription can be cancelled.", code="not_cancellable")
    _set_renewing(subscription, renewing=False, now=_now(now))
    _withdraw_renewal_intents(principal.organization, reason="cancelled")
    _audit(principal.organization, "billing.cancelled", principal=principal, ip=ip,
           active_until=subscription.renews_at.isoformat() if subscription.renews_at else None)
    return subscription


@transaction.atomic
def reactivate(*, principal: Principal, ip: str | None = None, now: datetime | None = None) -> Subscription:
    """Undo a cancellation before the paid period ends."""
    now = _now(now)
    subscription = _managed_subscription(principal)
    if (subscription.status != Subscription.Status.CANCELLED or subscription.renews_at is None
            or subscription.renews_at <= now):
        raise InvalidInput("Only a cancelled subscription whose period has not ended can be reactivated.",
                           code="not_reactivatable")
    _set_renewing(subscription, renewing=True, now=now)
    _audit(principal.organization, "billing.reactivated", principal=principal, ip=ip)
    return subscription


# --- the lifecycle (daily) ----------------------------------------------------------------------------


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
    now = _now(now)
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
        _audit(organization, "billing.period_ended", tier="free")
        report.expired += 1
    elif status == Subscription.Status.ACTIVE and renews_at <= now:
        scheduled = subscription.scheduled_tier
        if scheduled == "free":
            _to_free(subscription, status=Subscription.Status.ACTIVE)
            _audit(organization, "billing.downgraded", tier="free")
            report.downgraded += 1
            return
        if scheduled:
            subscription.tier = scheduled
            subscription.scheduled_tier = ""
            _audit(organization, "billing.downgraded", tier=scheduled)
            report.downgraded += 1
        # Not paid for the next period (a paid renewal would have moved renews_at on): grace. The
        # tier's limits stay, but overflow is no longer billed: new stacks and bytes past them are
        # refused until the renewal is paid.
        subscription.status = Subscription.Status.GRACE_PERIOD
        subscription.save()
        _set_org_tier(organization, scheduled or organization.tier, subscription)
        _open_renewal(subscription, now=now)
        _audit(organization, "billing.grace_started", tier=subscription.tier,
               grace_until=(renews_at + GRACE_PERIOD).isoformat())
        _mail(organization, "payment overdue",
              f"{organization.name}'s {subscription.tier} plan was due for renewal on {renews_at:%Y-%m-%d}. "
              f"It stays active for a grace period until {renews_at + GRACE_PERIOD:%Y-%m-%d}; pay the renewal on "
              "the dashboard's Billing page before then, or the school moves to the free tier.")
        report.grace += 1
    elif status == Subscription.Status.GRACE_PERIOD and renews_at + GRACE_PERIOD <= now:
        _to_free(subscription, status=Subscription.Status.EXPIRED)
        _withdraw_renewal_intents(organization, reason="expired")
        _audit(organization, "billing.expired", tier="free")
        _mail(organization, "plan expired",
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
    _audit(organization, "billing.renewal_warned", renews_at=renews_at.isoformat())
    _mail(organization, "renewal in 3 days", body)


def _to_free(subscription: Subscription, *, status: str) -> None:
    subscription.tier = Subscription.Tier.FREE
    subscription.status = status
    subscription.scheduled_tier = ""
    subscription.auto_renew = False
    subscription.starts_at = None
    subscription.renews_at = None
    subscription.warned_at = None
    subscription.save()
    _set_org_tier(subscription.organization, Subscription.Tier.FREE, subscription)


def expire_intents(*, now: datetime | None = None) -> int:
    """Close open intents nobody paid in time."""
    return Payment.objects.filter(status=Payment.Status.PENDING, expires_at__lte=_now(now)).update(
        status=Payment.Status.EXPIRED, failure_reason="expired")


# --- watching the treasury ---------------------------------------------------------------------------

WATCH_MAX_BLOCKS_PER_RUN = 50_000  # bounded work per beat run; the next run continues
WATCH_INITIAL_LOOKBACK = 50_000  # a new cursor starts this far back (more than a day of Base blocks)


@dataclass
class WatchReport:
    from_block: int = 0
    to_block: int = 0
    transfers: int = 0
    claimed: int = 0


def watch_treasury(*, now: datetime | None = None) -> WatchReport:
    """Follow the treasury's incoming USDC transfers from the stored cursor and claim each one
    that pays an open intent: sender linked to the intent's organization, exact amount (the
    oldest matching intent first). The full checks are claim_transfer's, as for a pasted hash."""
    now = _now(now)
    config = chain.chain_config()
    name = f"treasury:{config.chain_id}:{config.usdc_contract.lower()}:{config.treasury.lower()}"
    head = chain.head_block()
    cursor, _ = ChainCursor.objects.get_or_create(name=name,
                                                  defaults={"last_block": max(0, head - WATCH_INITIAL_LOOKBACK)})
    report = WatchReport(from_block=cursor.last_block + 1, to_block=min(head, cursor.last_block +
                                                                          WATCH_MAX_BLOCKS_PER_RUN))
    if report.to_block < report.from_block:
        return report
    transfers = chain.treasury_transfers(report.from_block, report.to_block)
    report.transfers = len(transfers)
    for transfer in transfers:
        if _match(transfer, now=now):
            report.claimed += 1
    ChainCursor.objects.filter(pk=cursor.pk).update(last_block=report.to_block)
    return report


def _match(transfer: chain.TreasuryTransfer, *, now: datetime) -> bool:
    if Payment.objects.filter(tx_hash=transfer.tx_hash.lower(), log_index=transfer.log_index,
                              status__in=Payment.CLAIMED).exists():
        return False
    candidates = Payment.objects.filter(
        status=Payment.Status.PENDING, expires_at__gt=now, amount=transfer.amount,
        organization__wallets__address=transfer.sender,
    ).select_related("organization").order_by("created_at", "pk")
    for payment in _distinct(candidates):
        try:
            result = claim_transfer(payment=payment, tx_hash=transfer.tx_hash, now=now)
        except (Conflict, InvalidInput):
            return False  # claimed meanwhile (by a confirm, or another run)
        if result.status != "failed":
            return True
    return False


def _distinct(payments: Iterable[Payment]) -> Iterable[Payment]:
    seen: set[int] = set()
    for payment in payments:
        if payment.pk not in seen:
            seen.add(payment.pk)
            yield payment
