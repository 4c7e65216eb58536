"""An agent's upgrade paid over HTTP 402 with an x402 `exact` authorization (docs/billing.md §4):
the quote, then the checked, submitted and claimed payment.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import transaction

from accounts.principal import Principal
from billing.chain.node import chain_config
from billing.chain.relayer import x402_submit
from billing.chain.x402 import SettlementRefused, x402_check, x402_decode_payment
from billing.models import Payment
from billing.selectors import PRICES, linked_addresses
from billing.services.payments import ConfirmResult, claim_transfer, ensure_upgradable, upgrade
from billing.services.subscriptions import audit
from memoryhub.errors import BillingUnavailable


def x402_offer(*, principal: Principal, tier: str) -> int:
    """The price an x402 upgrade asks for (base units), after every check an upgrade makes; no
    intent yet: the 402 answer is a quote, the intent opens when the signed payment arrives."""
    ensure_upgradable(principal, tier)
    if not chain_config().relayer_key:
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
    decoded = x402_decode_payment(payment_header)  # malformed: 400 before anything is stored
    ensure_upgradable(principal, tier)
    try:
        checked = x402_check(decoded.authorization, decoded.signature, expected_amount=PRICES[tier],
                             expected_from=linked_addresses(principal.organization))
    except SettlementRefused as refused:
        with transaction.atomic():
            _x402_refused(upgrade(principal=principal, tier=tier, ip=ip, now=now), refused, principal=principal,
                          ip=ip)
        raise
    payment = upgrade(principal=principal, tier=tier, ip=ip, now=now)
    try:
        tx_hash = x402_submit(checked)
    except SettlementRefused as refused:
        _x402_refused(payment, refused, principal=principal, ip=ip)
        raise
    # Settled (or submitted and not yet mined: the claim then answers pending and the re-check
    # task, or a confirm with this hash, carries on). Should the chain fail after submitting, the
    # intent stays open and the treasury watcher matches the transfer to it.
    result = claim_transfer(payment=payment, tx_hash=tx_hash, principal=principal, ip=ip, now=now)
    return X402Result(confirm=result, tx_hash=tx_hash, payer=decoded.payer)


def _x402_refused(payment: Payment, refused: SettlementRefused, *, principal: Principal,
                  ip: str | None) -> None:
    Payment.objects.filter(pk=payment.pk, status=Payment.Status.PENDING).update(
        status=Payment.Status.FAILED, failure_reason=f"x402_{refused.reason}"[:64])
    audit(payment.organization, "billing.transfer_refused", principal=principal, target_id=payment.public_id,
          ip=ip, reason=refused.reason, method="x402")
