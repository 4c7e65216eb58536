"""Subscriptions, payments, usage and wallets over HTTP (docs/kernle-protocol.md §12.8;
docs/billing.md §2). Thin: the rules are billing.selectors (who, what) and billing.services (writes);
billing.siwe_wallets links wallets. The chain being down is a 503 with Retry-After on the payment
routes only — nothing else here asks the chain."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.network import client_ip
from accounts.principal import Principal, principal_of
from accounts.schema import ERRORS, FORBIDDEN
from accounts.throttles import (
    PAYMENT_CONFIRM_THROTTLES,
    SUBSCRIPTION_CANCEL_THROTTLES,
    SUBSCRIPTION_DOWNGRADE_THROTTLES,
    SUBSCRIPTION_REACTIVATE_THROTTLES,
    SUBSCRIPTION_UPGRADE_THROTTLES,
    WALLET_LINK_THROTTLES,
    RequestRateThrottle,
)
from billing import siwe_wallets
from billing.chain.node import chain_config, explorer_tx_url
from billing.chain.x402 import x402_payment_required, x402_settle_response_header
from billing.models import Payment, Wallet
from billing.selectors import (
    API_PAYMENT_STATUS,
    ensure_may_read_billing,
    payment_for,
    payments_of,
    subscription_view,
    usage_of,
    usdc,
    wallets_of,
)
from billing.services.payments import chain_name, confirm, payment_link, upgrade
from billing.services.subscriptions import cancel, downgrade, reactivate
from billing.services.x402 import x402_offer, x402_pay
from memoryhub.errors import InvalidInput

TIERS = ["free", "core", "pro", "enterprise"]
NOT_FOUND = {404: OpenApiResponse(description="No such payment or wallet in the caller's organization")}
CHAIN_DOWN = {503: OpenApiResponse(description="Payments not configured (`billing_unavailable`) or the chain node "
                                               "unreachable (`chain_unavailable`); see Retry-After")}
MAX_PER_PAGE = 100


def _iso(value: Any) -> str | None:
    return value.isoformat() if value else None


# --- subscription -------------------------------------------------------------------------------------

_USAGE = inline_serializer("Usage", {
    "period": serializers.CharField(), "storage_used": serializers.IntegerField(),
    "storage_limit": serializers.IntegerField(allow_null=True), "sync_count": serializers.IntegerField(),
    "last_sync": serializers.DateTimeField(allow_null=True), "agents_used": serializers.IntegerField(),
    "agents_limit": serializers.IntegerField(allow_null=True)})
_SUBSCRIPTION = inline_serializer("Subscription", {
    "tier": serializers.CharField(), "status": serializers.CharField(),
    "starts_at": serializers.DateTimeField(allow_null=True), "renews_at": serializers.DateTimeField(allow_null=True),
    "cancelled_at": serializers.DateTimeField(allow_null=True), "auto_renew": serializers.BooleanField(),
    "renewal_amount": serializers.CharField(allow_null=True), "scheduled_tier": serializers.CharField(allow_null=True)})


class SubscriptionMeView(APIView):
    @extend_schema(operation_id="subscriptions_me", tags=["billing"],
                   responses={200: inline_serializer("SubscriptionMe", {"subscription": _SUBSCRIPTION,
                                                                         "usage": _USAGE}), **FORBIDDEN, **ERRORS},
                   summary="The organization's plan and what it uses (any key of it; admins and billing members)")
    def get(self, request: Request) -> Response:
        principal = principal_of(request)
        ensure_may_read_billing(principal)
        return Response({"subscription": subscription_view(principal.organization),
                         "usage": usage_of(principal.organization).as_dict()})


class UsageMeView(APIView):
    @extend_schema(operation_id="usage_me", tags=["billing"],
                   responses={200: inline_serializer("UsageMe", {"usage": _USAGE}), **FORBIDDEN, **ERRORS},
                   summary="What the organization uses of its plan this month")
    def get(self, request: Request) -> Response:
        principal = principal_of(request)
        ensure_may_read_billing(principal)
        return Response({"usage": usage_of(principal.organization).as_dict()})


class TierSerializer(serializers.Serializer[Any]):
    tier = serializers.ChoiceField(choices=TIERS)


class UpgradeSerializer(TierSerializer):
    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        # Added here rather than as a class attribute, which only DRF would read (vulture's dead code).
        fields = super().get_fields()
        fields["pay_with"] = serializers.ChoiceField(choices=["transfer", "x402"], default="transfer", help_text=(
            "`transfer` (default): a payment intent to pay from a linked wallet. `x402`: answered 402 with x402 "
            "PaymentRequirements; repeat the request with the `PAYMENT-SIGNATURE` header."))
        return fields


# What a confirm or an x402 payment answers (named once for the OpenAPI document: settings'
# ENUM_NAME_OVERRIDES "PaymentResultStatusEnum").
PAYMENT_RESULT_STATUSES = ("confirmed", "pending_verification", "failed")

# x402 v2 names these headers; v1 clients send X-PAYMENT.
X402_HEADERS = ("PAYMENT-SIGNATURE", "X-PAYMENT")
_PAYMENT_RESULT = inline_serializer("PaymentResult", {
    "payment_id": serializers.CharField(),
    "status": serializers.ChoiceField(PAYMENT_RESULT_STATUSES),
    "reason": serializers.CharField(allow_null=True), "tier": serializers.CharField(),
    "tx_hash": serializers.CharField(), "activated_at": serializers.DateTimeField(allow_null=True),
    "message": serializers.CharField()})


class UpgradeView(APIView):
    throttle_classes = [RequestRateThrottle, *SUBSCRIPTION_UPGRADE_THROTTLES]

    @extend_schema(operation_id="subscriptions_upgrade", tags=["billing"], request=UpgradeSerializer,
                   parameters=[OpenApiParameter("PAYMENT-SIGNATURE", str, OpenApiParameter.HEADER, required=False,
                                                description="x402 v2 payment payload (with pay_with=x402)")],
                   responses={201: inline_serializer("PaymentIntent", {
                       "payment_id": serializers.CharField(), "amount": serializers.CharField(),
                       "amount_base_units": serializers.IntegerField(), "currency": serializers.CharField(),
                       "treasury_address": serializers.CharField(), "chain": serializers.CharField(),
                       "chain_id": serializers.IntegerField(), "usdc_contract": serializers.CharField(),
                       "tier": serializers.CharField(), "expires_at": serializers.DateTimeField(),
                       "payment_link": serializers.CharField(), "message": serializers.CharField()}),
                       200: OpenApiResponse(_PAYMENT_RESULT, description="x402: settled on the chain; "
                                            "`PAYMENT-RESPONSE` header carries the x402 settlement"),
                       402: OpenApiResponse(description="x402: PaymentRequirements (body and `PAYMENT-REQUIRED` "
                                                        "header); sign and repeat with `PAYMENT-SIGNATURE`"),
                       422: OpenApiResponse(description="x402: the authorization was refused (`payment_refused`, "
                                                        "fields.reason); nothing was transferred"),
                       **FORBIDDEN, **CHAIN_DOWN, **ERRORS},
                   summary="Open a 24-hour payment intent for core or pro, or pay it at once over x402")
    def post(self, request: Request) -> Response:
        principal = principal_of(request)
        serializer = UpgradeSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        tier = serializer.validated_data["tier"]
        if serializer.validated_data["pay_with"] == "x402":
            return self._x402(request, principal, tier)
        payment = upgrade(principal=principal, tier=tier, ip=client_ip(request))
        config = chain_config()
        return Response({
            "payment_id": payment.public_id, "amount": usdc(payment.amount), "amount_base_units": payment.amount,
            "currency": payment.currency, "treasury_address": config.treasury, "chain": chain_name(
                config.chain_id), "chain_id": config.chain_id, "usdc_contract": config.usdc_contract,
            "tier": payment.tier, "expires_at": payment.expires_at.isoformat(),
            "payment_link": payment_link(payment, config),
            "message": (f"Send exactly {usdc(payment.amount)} USDC to {config.treasury} from a linked wallet "
                        "within 24 hours, then confirm with the transaction hash (or wait: transfers from "
                        "linked wallets are matched automatically)."),
        }, status=status.HTTP_201_CREATED)

    def _x402(self, request: Request, principal: Principal, tier: str) -> Response:
        header = next((request.headers[name] for name in X402_HEADERS if request.headers.get(name)), None)
        if header is None:
            amount = x402_offer(principal=principal, tier=tier)
            body, required = x402_payment_required(
                amount, resource_url=request.build_absolute_uri(),
                description=f"MemoryHub {tier}, one month ({usdc(amount)} USDC)")
            return Response(body, status=status.HTTP_402_PAYMENT_REQUIRED, headers={"PAYMENT-REQUIRED": required})
        paid = x402_pay(principal=principal, tier=tier, payment_header=header, ip=client_ip(request))
        result = paid.confirm
        return Response({"payment_id": result.payment.public_id, "status": result.status, "reason": result.reason,
                         "tier": result.payment.tier, "tx_hash": paid.tx_hash,
                         "activated_at": _iso(result.payment.confirmed_at), "message": result.message},
                        headers={"PAYMENT-RESPONSE": x402_settle_response_header(
                            paid.tx_hash, paid.payer, result.payment.amount)})


class ConfirmSerializer(serializers.Serializer[Any]):
    payment_id = serializers.CharField(max_length=40)
    tx_hash = serializers.RegexField(r"^0x[0-9a-fA-F]{64}$", error_messages={
        "invalid": "Expected 0x followed by 64 hexadecimal characters."})


class ConfirmView(APIView):
    throttle_classes = [RequestRateThrottle, *PAYMENT_CONFIRM_THROTTLES]

    @extend_schema(operation_id="subscriptions_payments_confirm", tags=["billing"], request=ConfirmSerializer,
                   responses={200: inline_serializer("PaymentConfirmed", {
                       "payment_id": serializers.CharField(),
                       "status": serializers.ChoiceField(PAYMENT_RESULT_STATUSES),
                       "reason": serializers.CharField(allow_null=True), "tier": serializers.CharField(),
                       "activated_at": serializers.DateTimeField(allow_null=True),
                       "message": serializers.CharField()}),
                       409: OpenApiResponse(description="The transfer already paid another payment"),
                       **FORBIDDEN, **NOT_FOUND, **CHAIN_DOWN, **ERRORS},
                   summary="Check a transfer on the chain and, once final, activate the tier")
    def post(self, request: Request) -> Response:
        principal = principal_of(request)
        serializer = ConfirmSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        payment = payment_for(principal, serializer.validated_data["payment_id"])
        result = confirm(principal=principal, payment=payment, tx_hash=serializer.validated_data["tx_hash"],
                         ip=client_ip(request))
        return Response({"payment_id": payment.public_id, "status": result.status, "reason": result.reason,
                         "tier": payment.tier, "activated_at": _iso(result.payment.confirmed_at),
                         "message": result.message})


class DowngradeView(APIView):
    throttle_classes = [RequestRateThrottle, *SUBSCRIPTION_DOWNGRADE_THROTTLES]

    @extend_schema(operation_id="subscriptions_downgrade", tags=["billing"], request=TierSerializer,
                   responses={200: inline_serializer("Downgrade", {
                       "current_tier": serializers.CharField(), "new_tier": serializers.CharField(),
                       "effective_at": serializers.DateTimeField(allow_null=True),
                       "message": serializers.CharField()}), **FORBIDDEN, **ERRORS},
                   summary="Move to a lower tier at the end of the paid period")
    def post(self, request: Request) -> Response:
        principal = principal_of(request)
        serializer = TierSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        subscription = downgrade(principal=principal, tier=serializer.validated_data["tier"],
                                 ip=client_ip(request))
        return Response({"current_tier": subscription.tier, "new_tier": subscription.scheduled_tier,
                         "effective_at": _iso(subscription.renews_at),
                         "message": f"{subscription.tier} stays until the end of the period; then "
                                    f"{subscription.scheduled_tier}."})


class CancelView(APIView):
    throttle_classes = [RequestRateThrottle, *SUBSCRIPTION_CANCEL_THROTTLES]

    @extend_schema(operation_id="subscriptions_cancel", tags=["billing"], request=None,
                   responses={200: inline_serializer("Cancelled", {
                       "tier": serializers.CharField(), "status": serializers.CharField(),
                       "cancelled_at": serializers.DateTimeField(), "active_until": serializers.DateTimeField(),
                       "message": serializers.CharField()}), **FORBIDDEN, **ERRORS},
                   summary="Stop renewing; the tier stays until the period ends, then free")
    def post(self, request: Request) -> Response:
        subscription = cancel(principal=principal_of(request), ip=client_ip(request))
        return Response({"tier": subscription.tier, "status": subscription.status,
                         "cancelled_at": _iso(subscription.cancelled_at), "active_until": _iso(subscription.renews_at),
                         "message": "Cancelled: the plan stays until the end of the paid period, then the free tier."})


class ReactivateView(APIView):
    throttle_classes = [RequestRateThrottle, *SUBSCRIPTION_REACTIVATE_THROTTLES]

    @extend_schema(operation_id="subscriptions_reactivate", tags=["billing"], request=None,
                   responses={200: inline_serializer("Reactivated", {
                       "tier": serializers.CharField(), "status": serializers.CharField(),
                       "auto_renew": serializers.BooleanField(), "renews_at": serializers.DateTimeField(),
                       "message": serializers.CharField()}), **FORBIDDEN, **ERRORS},
                   summary="Undo a cancellation before the period ends")
    def post(self, request: Request) -> Response:
        subscription = reactivate(principal=principal_of(request), ip=client_ip(request))
        return Response({"tier": subscription.tier, "status": subscription.status,
                         "auto_renew": subscription.auto_renew, "renews_at": _iso(subscription.renews_at),
                         "message": "Reactivated: the plan renews at the end of the period."})


def payment_row(payment: Payment) -> dict[str, Any]:
    return {"id": payment.public_id, "amount": usdc(payment.amount), "currency": payment.currency,
            "tx_hash": payment.tx_hash, "from_address": payment.from_address or None,
            "to_address": payment.to_address or None,
            "chain": chain_name(payment.chain_id) if payment.chain_id else None,
            "status": API_PAYMENT_STATUS[Payment.Status(payment.status)], "state": payment.status,
            "reason": payment.failure_reason or None, "tier": payment.tier, "kind": payment.kind,
            "period_start": _iso(payment.period_start), "period_end": _iso(payment.period_end),
            "created_at": _iso(payment.created_at), "expires_at": _iso(payment.expires_at),
            "claimed_at": _iso(payment.claimed_at), "confirmed_at": _iso(payment.confirmed_at),
            "explorer_url": explorer_tx_url(payment.tx_hash) if payment.tx_hash else None}


def _positive(request: Request, name: str, default: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise InvalidInput(f"{name} must be a positive integer.", fields={name: ["a positive integer"]})
    return int(raw)


class PaymentListView(APIView):
    @extend_schema(operation_id="subscriptions_payments", tags=["billing"],
                   parameters=[OpenApiParameter("page", int, required=False),
                               OpenApiParameter("per_page", int, required=False),
                               OpenApiParameter("limit", int, required=False, description="alias of per_page")],
                   responses={200: inline_serializer("PaymentPage", {
                       "payments": serializers.ListField(child=serializers.DictField()),
                       "total": serializers.IntegerField(), "page": serializers.IntegerField(),
                       "per_page": serializers.IntegerField()}), **FORBIDDEN, **ERRORS},
                   summary="The organization's payments, newest first")
    def get(self, request: Request) -> Response:
        payments = payments_of(principal_of(request))
        page = _positive(request, "page", 1)
        per_page = min(MAX_PER_PAGE, _positive(request, "per_page", _positive(request, "limit", 20)))
        start = (page - 1) * per_page
        rows = [payment_row(p) for p in payments[start:start + per_page]]
        return Response({"payments": rows, "total": payments.count(), "page": page, "per_page": per_page})


# --- wallets ------------------------------------------------------------------------------------------


def wallet_row(wallet: Wallet) -> dict[str, Any]:
    return {"address": wallet.address, "kind": wallet.kind, "linked_at": _iso(wallet.linked_at),
            "linked_by": wallet.linked_by.public_id if wallet.linked_by else None}


_WALLET = inline_serializer("Wallet", {"address": serializers.CharField(), "kind": serializers.CharField(),
                                       "linked_at": serializers.DateTimeField(),
                                       "linked_by": serializers.CharField(allow_null=True)})
_NONCE = inline_serializer("SiweNonce", {"nonce": serializers.CharField(), "expires_at": serializers.DateTimeField(),
                                         "domain": serializers.CharField(), "chain_id": serializers.IntegerField()})


class WalletNonceView(APIView):
    throttle_classes = [RequestRateThrottle, *WALLET_LINK_THROTTLES]

    def _issue(self, request: Request) -> Response:
        issued = siwe_wallets.nonce_issue(principal=principal_of(request), request_host=request.get_host())
        return Response({"nonce": issued.nonce, "expires_at": issued.expires_at.isoformat(), "domain": issued.domain,
                         "chain_id": issued.chain_id}, headers={"Cache-Control": "no-store"})

    @extend_schema(operation_id="wallets_nonce", tags=["billing"], responses={200: _NONCE, **FORBIDDEN, **ERRORS},
                   summary="A single-use nonce (10 minutes) for a Sign-In with Ethereum message")
    def get(self, request: Request) -> Response:
        return self._issue(request)

    @extend_schema(operation_id="wallets_nonce_create", tags=["billing"], request=None,
                   responses={200: _NONCE, **FORBIDDEN, **ERRORS}, summary="The same as GET")
    def post(self, request: Request) -> Response:
        return self._issue(request)


class LinkSerializer(serializers.Serializer[Any]):
    message = serializers.CharField(max_length=siwe_wallets.MAX_MESSAGE_CHARS, trim_whitespace=False)
    signature = serializers.RegexField(r"^0x[0-9a-fA-F]+$", max_length=4000)


class WalletLinkView(APIView):
    throttle_classes = [RequestRateThrottle, *WALLET_LINK_THROTTLES]

    @extend_schema(operation_id="wallets_link", tags=["billing"], request=LinkSerializer,
                   responses={201: _WALLET, 200: _WALLET, **FORBIDDEN, **CHAIN_DOWN, **ERRORS},
                   summary="Link the wallet that signed an EIP-4361 message with our nonce, domain and chain")
    def post(self, request: Request) -> Response:
        serializer = LinkSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        wallet, created = siwe_wallets.wallet_link(
            principal=principal_of(request), message=serializer.validated_data["message"],
            signature=serializer.validated_data["signature"], request_host=request.get_host(), ip=client_ip(request))
        return Response(wallet_row(wallet), status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class WalletListView(APIView):
    @extend_schema(operation_id="wallets_me", tags=["billing"],
                   responses={200: inline_serializer("Wallets", {"wallets": serializers.ListField(child=_WALLET)}),
                              **FORBIDDEN, **ERRORS},
                   summary="The wallets linked to the organization")
    def get(self, request: Request) -> Response:
        principal = principal_of(request)
        ensure_may_read_billing(principal)
        wallets = wallets_of(principal.organization).select_related("linked_by")
        return Response({"wallets": [wallet_row(w) for w in wallets]})


class WalletDetailView(APIView):
    @extend_schema(operation_id="wallets_unlink", tags=["billing"], request=None,
                   responses={204: None, **FORBIDDEN, **NOT_FOUND, **ERRORS}, summary="Unlink a wallet")
    def delete(self, request: Request, address: str) -> Response:
        siwe_wallets.wallet_unlink(principal=principal_of(request), address=address, ip=client_ip(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class WalletClaimView(APIView):
    @extend_schema(operation_id="wallets_claim_retired", tags=["billing"], request=None,
                   responses={410: OpenApiResponse(description="Retired: link wallets with SIWE"), **ERRORS},
                   summary="Retired legacy route (took an address on trust); use /wallets/nonce and /wallets/link")
    def post(self, request: Request) -> Response:
        principal_of(request)
        raise siwe_wallets.claim_retired()
