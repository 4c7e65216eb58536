"""Dashboard: the school's plan and what it uses of it now (school admins and billing users).

The plan is accounts.tiers (the one table of tiers); storage is measured exactly as it is enforced,
by billing.entitlements.storage_used (the sum of the stacks' `bytes_used` counters). The page reads
counters only, so it costs the same at 20 students as at 2,000.

Paying, downgrading, cancelling and wallets go through billing.services and billing.siwe_wallets,
the same functions the API calls; these views only read forms and redirect. A browser wallet
(EIP-1193) is driven by static/dashboard/billing.js: it signs the SIWE message built here and
calls the API routes with the dashboard's session and CSRF token (docs/billing.md §2).

A billing user sees this page and nothing else of the dashboard (dashboard.access roles), and no
student's name: usage is shown for the school as a whole.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import segno
import siwe
from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import Count, Q, Sum
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.template.defaultfilters import filesizeformat
from django.urls import reverse
from django.utils import timezone
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_POST
from eth_utils import is_address, to_checksum_address

from accounts.principal import Principal
from accounts.tiers import TIERS, Tier, tier_for
from billing import siwe_wallets
from billing.chain.node import ChainConfig, chain_config, explorer_tx_url
from billing.chain.transfers import normalize_tx_hash
from billing.entitlements import storage_used
from billing.models import Payment, Subscription
from billing.selectors import (
    API_PAYMENT_STATUS,
    OVERFLOW,
    PAID_TIERS,
    PRICES,
    may_manage_billing,
    payment_for,
    payments_of,
    renewal_amount,
    subscription_of,
    tier_rank,
    usdc,
    wallets_of,
)
from billing.services.lifecycle import GRACE_PERIOD
from billing.services.payments import chain_name, confirm, payment_link, upgrade
from billing.services.subscriptions import cancel, downgrade, reactivate
from dashboard.access import BILLING_PAGES, dashboard_page, request_ip
from memoryhub.errors import BillingUnavailable, InvalidInput
from stacks.models import Stack

# Tiers a school can be on; "unlimited" is the operators' own (docs/kernle-protocol.md §7.4) and is
# listed only to a school that happens to be on it.
OFFERED_TIERS = ("free", "core", "pro", "enterprise")
NEAR_LIMIT = 80  # percent of a limit from which the gauge warns


def _gauge(used: int, limit: int | None) -> dict[str, Any]:
    if limit is None:
        return {"used": used, "limit": None, "percent": None, "state": "ok"}
    percent = round(100 * used / limit, 1) if limit else 100.0
    state = "danger" if used >= limit else "warn" if percent >= NEAR_LIMIT else "ok"
    label = "under 0.1" if used > 0 and percent < 0.1 else f"{percent:g}"
    # <meter>'s own colours: green below `low`, amber up to `high` (the limit), red from there.
    return {"used": used, "limit": limit, "percent": percent, "percent_label": label, "state": state,
            "meter_max": max(limit, used), "meter_low": limit * NEAR_LIMIT // 100}


def _tier_row(tier: Tier, current: Tier) -> dict[str, Any]:
    """One row of the Plans table: limits, the monthly price and what growth past the limits costs."""
    if tier.name in PRICES:
        price = f"{usdc(PRICES[tier.name])} USDC"
    else:
        price = "free" if tier.name == "free" else "by contract"
    overflow = OVERFLOW.get(tier.name)
    return {"name": tier.name, "storage": tier.storage_label,
            "stacks": "unlimited" if tier.syncing_stacks is None else tier.syncing_stacks,
            "price": price,
            "overflow": (f"{usdc(overflow.per_stack)} USDC per extra stack, {usdc(overflow.per_gb)} per extra GB"
                         if overflow else "refused past the limits" if tier.storage_bytes is not None else ""),
            "current": tier.name == current.name}


# The usage chart's colours: in use (the dashboard's blue), still free (a pale track), past the
# limit (the warning orange; only a plan that bills overflow gets there).
USED, FREE, OVER = "#1f4fbf", "#d9dee7", "#c2571a"


def _chart(rows: list[tuple[str, dict[str, Any], str]]) -> dict[str, Any] | None:
    """Each limit as one horizontal bar 100 % long: the share in use, the share still free and,
    for a plan that bills overflow, the share past the limit, with the numbers in the bar's label.

    A bar of usage beside a bar of the limit drew a new school's 0 bytes of 10 MB as one big limit
    bar and nothing else; on a track of what is free, an empty plan reads as "all free" and a
    crowded one as "little left". Drawn by static/dashboard/billing.js (canvas[data-billing-chart])."""
    shown = [(label, gauge, amount) for label, gauge, amount in rows if gauge["percent"] is not None]
    if not shown:
        return None
    percents = [float(gauge["percent"]) for _, gauge, _ in shown]
    datasets = [
        {"label": "In use", "data": [min(p, 100.0) for p in percents], "color": USED},
        {"label": "Still free", "data": [round(max(0.0, 100.0 - p), 1) for p in percents], "color": FREE},
    ]
    if any(p > 100 for p in percents):
        datasets.append({"label": "Past the limit (billed)", "data": [round(max(0.0, p - 100.0), 1)
                                                                      for p in percents], "color": OVER})
    return {"labels": [[label, f"{amount} · {gauge['percent_label']}%"] for label, gauge, amount in shown],
            "notes": [f"{gauge['percent_label']} % in use" for _, gauge, _ in shown], "datasets": datasets,
            "x_label": "% of your plan's limit", "max": max(100.0, *percents)}


PAYMENTS_PER_PAGE = 10


def _payments_configured() -> ChainConfig | None:
    try:
        return chain_config()
    except BillingUnavailable:
        return None


def _plan(organization: Any, subscription: Subscription | None, *, now: datetime) -> dict[str, Any]:
    """Status, dates and the changes the subscription allows now (the services re-check each)."""
    current = subscription.tier if subscription and subscription.status != Subscription.Status.EXPIRED \
        else organization.tier
    status = subscription.status if subscription else Subscription.Status.ACTIVE
    renews_at = subscription.renews_at if subscription else None
    paid = subscription is not None and subscription.tier in PAID_TIERS and status != Subscription.Status.EXPIRED
    return {
        "status": status, "status_label": status.replace("_", " "), "renews_at": renews_at,
        "grace_ends": renews_at + GRACE_PERIOD if renews_at and status == Subscription.Status.GRACE_PERIOD
        else None,
        "scheduled_tier": subscription.scheduled_tier if subscription else "",
        # Overflow included (stacks or GB past the limit on a paid tier), as the renewal intent will ask.
        "renewal_amount": usdc(amount) if paid and (amount := renewal_amount(organization, subscription)) else None,
        "upgrades": [{"name": t, "price": usdc(PRICES[t])} for t in PAID_TIERS if tier_rank(t) > tier_rank(current)],
        "downgrades": [t for t in ("free", *PAID_TIERS) if tier_rank(t) < tier_rank(current)] if paid
        and status == Subscription.Status.ACTIVE else [],
        "may_cancel": paid and status == Subscription.Status.ACTIVE,
        "may_reactivate": bool(status == Subscription.Status.CANCELLED and renews_at and renews_at > now),
    }


def _payment_row(payment: Payment) -> dict[str, Any]:
    return {"id": payment.public_id, "tier": payment.tier, "kind": payment.kind, "amount": usdc(payment.amount),
            "status": API_PAYMENT_STATUS[Payment.Status(payment.status)], "state": payment.status,
            "state_label": payment.status.replace("_", " "), "reason": payment.failure_reason,
            "created_at": payment.created_at, "tx_hash": payment.tx_hash,
            "explorer_url": explorer_tx_url(payment.tx_hash) if payment.tx_hash else None,
            "open": payment.status in (Payment.Status.PENDING, Payment.Status.PENDING_VERIFICATION)
            and payment.expires_at > timezone.now()}


@dashboard_page(roles=BILLING_PAGES)
def billing(request: HttpRequest, principal: Principal) -> HttpResponse:
    organization = principal.organization
    tier = tier_for(organization)  # an unmapped tier is a 503 page, never a guess
    totals = Stack.objects.filter(organization_id=organization.pk).aggregate(
        active=Count("id", filter=Q(status=Stack.Status.ACTIVE)),
        archived=Count("id", filter=Q(status=Stack.Status.ARCHIVED)),
        memories=Sum("memory_count"),
    )
    stacks = _gauge(totals["active"], tier.syncing_stacks)
    storage = _gauge(storage_used(organization=organization), tier.storage_bytes)
    storage["used_label"] = filesizeformat(storage["used"])
    storage["limit_label"] = tier.storage_label
    shown = [TIERS[name] for name in OFFERED_TIERS]
    if tier.name not in OFFERED_TIERS:
        shown.append(tier)
    page = Paginator(payments_of(principal), PAYMENTS_PER_PAGE).get_page(request.GET.get("page"))
    config = _payments_configured()
    return render(request, "dashboard/billing/billing.html", {
        "organization": organization, "tier": tier, "stacks": stacks, "storage": storage,
        "archived": totals["archived"], "memories": int(totals["memories"] or 0),
        "tiers": [_tier_row(t, tier) for t in shown],
        "chart": _chart([("Active stacks", stacks, f"{stacks['used']} of {stacks['limit']}"),
                         ("Storage", storage, f"{storage['used_label']} of {storage['limit_label']}")]),
        "plan": _plan(organization, subscription_of(organization), now=timezone.now()),
        "may_manage": may_manage_billing(principal), "payments_configured": config is not None,
        "chain_id": config.chain_id if config else None,
        "wallets": list(wallets_of(organization)), "page": page,
        "payments": [_payment_row(p) for p in page.object_list],
    })


@dashboard_page(roles=BILLING_PAGES)
@require_POST
def billing_upgrade(request: HttpRequest, principal: Principal) -> HttpResponse:
    payment = upgrade(principal=principal, tier=request.POST.get("tier", ""), ip=request_ip(request))
    return redirect("dashboard:billing-payment", payment_id=payment.public_id)


@dashboard_page(roles=BILLING_PAGES)
def billing_payment(request: HttpRequest, principal: Principal, payment_id: str) -> HttpResponse:
    """One payment: how to pay it (amount, treasury, EIP-681 link and its QR code) while it is
    open, and where it stands."""
    payment = payment_for(principal, payment_id)
    config = chain_config()
    link = payment_link(payment, config)
    # Server-side SVG (no script, no image request): segno writes paths only, which the CSP allows.
    qr = segno.make(link, error="m").svg_inline(scale=4, title="QR code of the payment link")
    return render(request, "dashboard/billing/payment.html", {
        "organization": principal.organization, "payment": _payment_row(payment), "record": payment,
        "config": config, "chain_name": chain_name(config.chain_id), "link": link,
        "qr_svg": mark_safe(qr),  # noqa: S308 - segno's own SVG of our own link
        "amount_base_units": payment.amount, "chain_id_hex": hex(config.chain_id),
        "may_manage": may_manage_billing(principal),
    })


@dashboard_page(roles=BILLING_PAGES)
@require_POST
def billing_confirm(request: HttpRequest, principal: Principal, payment_id: str) -> HttpResponse:
    payment = payment_for(principal, payment_id)
    tx_hash = request.POST.get("tx_hash", "").strip()
    result = confirm(principal=principal, payment=payment, tx_hash=normalize_tx_hash(tx_hash),
                     ip=request_ip(request))
    level = {"confirmed": messages.SUCCESS, "failed": messages.ERROR}.get(result.status, messages.INFO)
    messages.add_message(request, level, result.message)
    return redirect("dashboard:billing-payment", payment_id=payment.public_id)


def _plan_changed(request: HttpRequest, principal: Principal, change: Callable[..., Subscription],
                  said: Callable[[Subscription], str], **fields: Any) -> HttpResponse:
    """Downgrade, cancel, reactivate: the service (which checks everything) with the form's fields,
    then what it did as a message on the billing page."""
    subscription = change(principal=principal, ip=request_ip(request), **fields)
    messages.success(request, said(subscription))
    return redirect("dashboard:billing")


@dashboard_page(roles=BILLING_PAGES)
@require_POST
def billing_downgrade(request: HttpRequest, principal: Principal) -> HttpResponse:
    return _plan_changed(request, principal, downgrade, lambda subscription: (
        f"{subscription.tier.capitalize()} stays until the end of the period; then {subscription.scheduled_tier}."),
        tier=request.POST.get("tier", ""))


@dashboard_page(roles=BILLING_PAGES)
@require_POST
def billing_cancel(request: HttpRequest, principal: Principal) -> HttpResponse:
    return _plan_changed(request, principal, cancel, lambda _: (
        "Cancelled: the plan stays until the end of the paid period, then the free tier."))


@dashboard_page(roles=BILLING_PAGES)
@require_POST
def billing_reactivate(request: HttpRequest, principal: Principal) -> HttpResponse:
    return _plan_changed(request, principal, reactivate,
                         lambda _: "Reactivated: the plan renews at the end of the period.")


@dashboard_page(roles=BILLING_PAGES)
@require_POST
def billing_wallet_unlink(request: HttpRequest, principal: Principal, address: str) -> HttpResponse:
    siwe_wallets.wallet_unlink(principal=principal, address=address, ip=request_ip(request))
    messages.success(request, f"Wallet {address} was unlinked; its transfers no longer pay for this school.")
    return redirect("dashboard:billing")


@dashboard_page(roles=BILLING_PAGES)
@require_POST
def billing_wallet_message(request: HttpRequest, principal: Principal) -> HttpResponse:
    """The EIP-4361 message a browser wallet signs to link itself: a fresh single-use nonce
    (siwe_wallets.nonce_issue, as GET /api/v1/wallets/nonce) and the address in EIP-55 form,
    which a browser cannot compute without a Keccak library. billing.js signs it and posts it to
    POST /api/v1/wallets/link, which checks everything again."""
    address = request.POST.get("address", "")
    if not is_address(address):
        raise InvalidInput("address must be an Ethereum address.", code="invalid_address",
                           fields={"address": ["0x followed by 40 hexadecimal characters"]})
    issued = siwe_wallets.nonce_issue(principal=principal, request_host=request.get_host())
    message = siwe.SiweMessage(
        domain=issued.domain, address=to_checksum_address(address),
        statement=f"Link this wallet to {principal.organization.name} on MemoryHub, so that its USDC "
                  "transfers pay for the organization's plan.",
        uri=request.build_absolute_uri(reverse("dashboard:billing")), version="1", chain_id=issued.chain_id,
        nonce=issued.nonce, issued_at=siwe.ISO8601Datetime.from_datetime(datetime.now(UTC)),
        expiration_time=siwe.ISO8601Datetime.from_datetime(issued.expires_at)).prepare_message()
    return JsonResponse({"message": message}, headers={"Cache-Control": "no-store"})
