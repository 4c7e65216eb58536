"""Django admin for staff: billing is shown, never edited here. Tiers move only through
billing.services (a verified payment, the lifecycle, a downgrade), which keep the subscription,
`Organization.tier` and the audit log in step; an edit here would break that."""

from __future__ import annotations

from django.contrib import admin

from accounts.admin import ReadOnlyAdmin
from billing.models import ChainCursor, Payment, SiweNonce, Subscription, Wallet


@admin.register(Subscription)
class SubscriptionAdmin(ReadOnlyAdmin):
    list_display = ["organization", "tier", "status", "renews_at", "auto_renew", "scheduled_tier"]
    list_filter = ["tier", "status"]


@admin.register(Payment)
class PaymentAdmin(ReadOnlyAdmin):
    list_display = ["public_id", "organization", "tier", "amount", "status", "tx_hash", "created_at", "confirmed_at"]
    list_filter = ["status", "tier", "kind"]
    search_fields = ["public_id", "tx_hash"]


@admin.register(Wallet)
class WalletAdmin(ReadOnlyAdmin):
    list_display = ["address", "organization", "kind", "linked_at"]
    search_fields = ["address"]


@admin.register(SiweNonce)
class SiweNonceAdmin(ReadOnlyAdmin):
    # The nonce itself is never stored, only its hash; the hash is not shown either.
    list_display = ["organization", "created_at", "expires_at", "consumed_at"]
    exclude = ["nonce_hash"]


@admin.register(ChainCursor)
class ChainCursorAdmin(ReadOnlyAdmin):
    list_display = ["name", "last_block", "updated_at"]
