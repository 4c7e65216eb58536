"""Subscriptions, linked wallets, SIWE nonces, payments (intents and the transfers that pay them) and
the treasury watcher's block cursor (docs/kernle-protocol.md §12.7-12.8; docs/billing.md).

`Organization.tier` stays the tier every limit is read from (accounts.tiers); a subscription is the
billing record that moves it: billing.services writes both in one transaction whenever a payment
activates a tier, a period lapses or a downgrade takes effect.
"""

from __future__ import annotations

import secrets

from django.db import models
from django.db.models import Q

from accounts.models import Organization, User


def new_payment_public_id() -> str:
    return f"pay_{secrets.token_hex(8)}"


class Subscription(models.Model):
    """An organization's plan. An organization without a row is on the tier `Organization.tier`
    names (free unless an operator set another) and has never paid."""

    class Tier(models.TextChoices):
        FREE = "free"
        CORE = "core"
        PRO = "pro"
        ENTERPRISE = "enterprise"

    class Status(models.TextChoices):
        ACTIVE = "active"
        GRACE_PERIOD = "grace_period"
        CANCELLED = "cancelled"
        EXPIRED = "expired"

    organization = models.OneToOneField(Organization, on_delete=models.CASCADE, related_name="subscription")
    tier = models.CharField(max_length=16, choices=Tier.choices, default=Tier.FREE)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    starts_at = models.DateTimeField(null=True, blank=True)  # start of the current paid period
    renews_at = models.DateTimeField(null=True, blank=True)  # end of the current paid period
    cancelled_at = models.DateTimeField(null=True, blank=True)
    auto_renew = models.BooleanField(default=False)
    # A downgrade waits for the end of the paid period; "" when none is scheduled.
    scheduled_tier = models.CharField(max_length=16, choices=Tier.choices, blank=True, default="")
    # When the renewal warning for the period ending at `renews_at` was sent (one per period).
    warned_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.organization_id}: {self.tier} ({self.status})"


class Wallet(models.Model):
    """An address an organization proved it controls by signing a SIWE message (billing.siwe).
    Only transfers from a linked wallet can pay the organization's intents."""

    class Kind(models.TextChoices):
        EOA = "eoa"
        CONTRACT = "contract"  # verified through the chain with EIP-1271

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="wallets")
    address = models.CharField(max_length=42)  # EIP-55 checksummed
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.EOA)
    linked_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    linked_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["organization", "address"],
                                               name="billing_wallet_unique_per_org")]
        indexes = [models.Index(fields=["address"], name="billing_wallet_address")]


class SiweNonce(models.Model):
    """A single-use SIWE nonce issued to one organization. Only its SHA-256 is stored; it is
    consumed by the conditional UPDATE that links the wallet, so a replay finds it used."""

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="+")
    nonce_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    consumed_at = models.DateTimeField(null=True, blank=True)


class Payment(models.Model):
    """A payment intent (what to pay, until when) and, once claimed, the on-chain transfer that
    pays it. One transfer — (chain id, tx hash, log index) — can be claimed by one payment only."""

    class Kind(models.TextChoices):
        UPGRADE = "upgrade"
        RENEWAL = "renewal"

    class Status(models.TextChoices):
        PENDING = "pending"  # open intent, no transfer claimed yet
        PENDING_VERIFICATION = "pending_verification"  # transfer claimed, too few confirmations
        CONFIRMED = "confirmed"  # tier activated
        FAILED = "failed"  # the claimed transfer vanished before it was confirmed
        EXPIRED = "expired"  # nobody paid in time
        REVERTED = "reverted"  # a reorg removed a confirmed transfer before finality

    CLAIMED = (Status.PENDING_VERIFICATION, Status.CONFIRMED)

    public_id = models.CharField(max_length=40, unique=True, default=new_payment_public_id, editable=False)
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="payments")
    created_by = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.UPGRADE)
    tier = models.CharField(max_length=16, choices=Subscription.Tier.choices)
    amount = models.PositiveBigIntegerField()  # USDC base units (6 decimals): 5 USDC = 5_000_000
    currency = models.CharField(max_length=8, default="USDC")
    status = models.CharField(max_length=24, choices=Status.choices, default=Status.PENDING)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    # The transfer, once claimed.
    chain_id = models.PositiveBigIntegerField(null=True, blank=True)
    tx_hash = models.CharField(max_length=66, null=True, blank=True)
    log_index = models.PositiveIntegerField(null=True, blank=True)
    from_address = models.CharField(max_length=42, blank=True, default="")
    to_address = models.CharField(max_length=42, blank=True, default="")
    block_number = models.PositiveBigIntegerField(null=True, blank=True)
    block_hash = models.CharField(max_length=66, blank=True, default="")
    claimed_at = models.DateTimeField(null=True, blank=True)
    # The paid period and when the tier was activated.
    period_start = models.DateTimeField(null=True, blank=True)
    period_end = models.DateTimeField(null=True, blank=True)
    confirmed_at = models.DateTimeField(null=True, blank=True)
    # Deep enough that a reorg can no longer remove it (settings.PAYMENT_FINALITY_CONFIRMATIONS).
    finalized_at = models.DateTimeField(null=True, blank=True)
    # Machine-readable reason of the last refusal or of the failure (billing.chain's reasons).
    failure_reason = models.CharField(max_length=64, blank=True, default="")
    # The subscription as it was before this payment activated a tier: a reorg restores it.
    previous_subscription = models.JSONField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["chain_id", "tx_hash", "log_index"], name="billing_payment_transfer_claimed_once",
                condition=Q(status__in=["pending_verification", "confirmed"]),
            ),
        ]
        indexes = [
            models.Index(fields=["organization", "-created_at"], name="billing_payment_org_time"),
            models.Index(fields=["status", "expires_at"], name="billing_payment_status"),
        ]


class ChainCursor(models.Model):
    """The last block the treasury watcher has scanned, per (chain, token, treasury)."""

    name = models.CharField(max_length=200, unique=True)
    last_block = models.PositiveBigIntegerField()
    updated_at = models.DateTimeField(auto_now=True)
