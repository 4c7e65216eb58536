"""Payment intents, claiming and confirming a USDC transfer, re-checking claimed transfers until
final, and watching the treasury (the package docstring has the rules; docs/billing.md §3).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q

from accounts.principal import Principal
from billing.chain.node import ChainConfig, chain_config, head_block
from billing.chain.transfers import TransferCheck, TreasuryTransfer, inspect_transfer, treasury_transfers
from billing.models import ChainCursor, Payment, Subscription
from billing.selectors import PAID_TIERS, PRICES, ensure_may_manage_billing, linked_addresses, tier_rank
from billing.services.subscriptions import activate, audit, current_tier, current_time, revert
from memoryhub.errors import Conflict, InvalidInput
from memoryhub.metrics import PAYMENT_VERIFICATIONS

INTENT_LIFETIME = timedelta(hours=24)


# --- intents ------------------------------------------------------------------------------------


def payment_link(payment: Payment, config: ChainConfig) -> str:
    """EIP-681 link a wallet app opens as "send `amount` USDC to the treasury" (a QR code of it)."""
    return (f"ethereum:{config.usdc_contract}@{config.chain_id}/transfer"
            f"?address={config.treasury}&uint256={payment.amount}")


def chain_name(chain_id: int) -> str:
    return {8453: "base", 84532: "base-sepolia", 31337: "anvil"}.get(chain_id, f"eip155:{chain_id}")


@transaction.atomic
def upgrade(*, principal: Principal, tier: str, ip: str | None = None, now: datetime | None = None) -> Payment:
    """Open a 24-hour payment intent for a higher paid tier (§12.8). 400 for free, enterprise
    (a contract, not a payment), an unknown tier, or the same or a lower tier than the current."""
    ensure_upgradable(principal, tier)
    now = current_time(now)
    organization = principal.organization
    payment = Payment.objects.create(organization=organization, created_by=principal.user, kind=Payment.Kind.UPGRADE,
                                     tier=tier, amount=PRICES[tier], created_at=now,
                                     expires_at=now + INTENT_LIFETIME)
    audit(organization, "billing.intent_created", principal=principal, target_id=payment.public_id, ip=ip,
          tier=tier, amount=payment.amount)
    return payment


def ensure_upgradable(principal: Principal, tier: str) -> None:
    """The checks before any upgrade intent (by transfer or by x402): who, which tier, and a chain
    and treasury to pay on."""
    ensure_may_manage_billing(principal)
    if tier not in PAID_TIERS:
        message = ("Enterprise is arranged by contract, not paid here." if tier == Subscription.Tier.ENTERPRISE
                   else "Upgrade to core or pro.")
        raise InvalidInput(message, code="invalid_tier", fields={"tier": ["core or pro"]})
    organization = principal.organization
    current = current_tier(organization)
    if tier_rank(tier) <= tier_rank(current):
        raise InvalidInput(f"Already on {current}; an upgrade must be to a higher tier (downgrades take effect"
                           " at the end of the period: POST /api/v1/subscriptions/downgrade).",
                           code="not_an_upgrade", fields={"tier": [f"higher than {current}"]})
    chain_config()  # no chain or no treasury configured: 503, never an intent nobody can pay


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
    now = current_time(now)
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
    now = current_time(now)
    senders = linked_addresses(payment.organization)
    if payment.from_address:  # a claimed transfer stays its sender's even if that wallet is unlinked since
        senders = senders | {payment.from_address}
    check = inspect_transfer(tx_hash, expected_amount=payment.amount, expected_from=set(senders),
                             not_before=payment.created_at)
    PAYMENT_VERIFICATIONS.labels(check.status).inc()
    if check.status == "failed" or (check.status == "pending" and check.reason == "not_mined"):
        reason = check.reason or "failed"
        Payment.objects.filter(pk=payment.pk, status=Payment.Status.PENDING).update(failure_reason=reason[:64])
        payment.failure_reason = reason[:64]
        if check.status == "pending":
            return ConfirmResult(payment, "pending_verification", reason, check.message)
        audit(payment.organization, "billing.transfer_refused", principal=principal, target_id=payment.public_id,
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
            activate(locked, now=now, principal=principal, ip=ip)
            return ConfirmResult(locked, "confirmed", None, f"Payment confirmed: {locked.tier} is active.")
        Payment.objects.filter(pk=locked.pk).update(block_number=check.block_number, block_hash=check.block_hash or "")
    return ConfirmResult(locked, "pending_verification", check.reason,
                         f"Transfer found with {check.confirmations} of {chain_config().confirmations} "
                         "confirmations; it is re-checked until confirmed. Retry later.")


def _claim(payment: Payment, check: TransferCheck, *, now: datetime) -> None:
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


# --- re-checking claimed transfers until final ---------------------------------------------------------


def recheck(payment: Payment, *, now: datetime | None = None) -> str:
    """One re-check of a claimed transfer (billing.tasks): confirm it once deep enough, drop the
    claim if it vanished before confirmation, revert the activation if a reorg removed it before
    finality, and mark it final. Returns the payment's status afterwards."""
    now = current_time(now)
    config = chain_config()
    check = inspect_transfer(payment.tx_hash or "", expected_amount=payment.amount,
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
                audit(locked.organization, "billing.transfer_dropped", target_id=locked.public_id,
                      reason=locked.failure_reason)
            elif check.status == "confirmed":
                activate(locked, now=now)
        elif locked.status == Payment.Status.CONFIRMED and locked.finalized_at is None:
            if gone:
                revert(locked, now=now, reason="reorg" if check.reason in ("unknown_tx", "not_mined")
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


def finality_confirmations(config: ChainConfig) -> int:
    """Depth after which a confirmed payment is no longer watched for reorgs."""
    return settings.PAYMENT_FINALITY_CONFIRMATIONS or 2 * config.confirmations


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
    now = current_time(now)
    config = chain_config()
    name = f"treasury:{config.chain_id}:{config.usdc_contract.lower()}:{config.treasury.lower()}"
    head = head_block()
    cursor, _ = ChainCursor.objects.get_or_create(name=name,
                                                  defaults={"last_block": max(0, head - WATCH_INITIAL_LOOKBACK)})
    report = WatchReport(from_block=cursor.last_block + 1, to_block=min(head, cursor.last_block +
                                                                          WATCH_MAX_BLOCKS_PER_RUN))
    if report.to_block < report.from_block:
        return report
    transfers = treasury_transfers(report.from_block, report.to_block)
    report.transfers = len(transfers)
    for transfer in transfers:
        if _match(transfer, now=now):
            report.claimed += 1
    ChainCursor.objects.filter(pk=cursor.pk).update(last_block=report.to_block)
    return report


def _match(transfer: TreasuryTransfer, *, now: datetime) -> bool:
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
