"""Billing routes (docs/kernle-protocol.md §12.8): subscriptions, payments, usage and wallets."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, path

from billing import api

urlpatterns: list[URLPattern | URLResolver] = [
    path("api/v1/subscriptions/me", api.SubscriptionMeView.as_view(), name="subscription-me"),
    path("api/v1/subscriptions/upgrade", api.UpgradeView.as_view(), name="subscription-upgrade"),
    path("api/v1/subscriptions/payments/confirm", api.ConfirmView.as_view(), name="payment-confirm"),
    path("api/v1/subscriptions/payments", api.PaymentListView.as_view(), name="payments"),
    path("api/v1/subscriptions/downgrade", api.DowngradeView.as_view(), name="subscription-downgrade"),
    path("api/v1/subscriptions/cancel", api.CancelView.as_view(), name="subscription-cancel"),
    path("api/v1/subscriptions/reactivate", api.ReactivateView.as_view(), name="subscription-reactivate"),
    path("api/v1/usage/me", api.UsageMeView.as_view(), name="usage-me"),
    path("api/v1/wallets/nonce", api.WalletNonceView.as_view(), name="wallet-nonce"),
    path("api/v1/wallets/link", api.WalletLinkView.as_view(), name="wallet-link"),
    path("api/v1/wallets/me", api.WalletListView.as_view(), name="wallets-me"),
    path("api/v1/wallets/claim", api.WalletClaimView.as_view(), name="wallet-claim"),
    path("api/v1/wallets/<str:address>", api.WalletDetailView.as_view(), name="wallet"),
]
