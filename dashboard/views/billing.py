"""Dashboard: the school's plan and what it uses of it now (school admins and billing users).

The plan is accounts.tiers (the one table of tiers); storage is measured exactly as it is enforced,
by billing.entitlements.storage_used (the sum of the stacks' `bytes_used` counters). The page reads
counters only, so it costs the same at 20 students as at 2,000. Paying (in USDC) comes with the
billing issue; until then this page shows and compares, it sells nothing.

A billing user sees this page and nothing else of the dashboard (dashboard.access roles), and no
student's name: usage is shown for the school as a whole.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Q, Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.template.defaultfilters import filesizeformat

from accounts.principal import Principal
from accounts.tiers import TIERS, Tier, tier_for
from billing.entitlements import storage_used
from dashboard.access import BILLING_PAGES, dashboard_page
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
    return {"name": tier.name, "storage": tier.storage_label,
            "stacks": "unlimited" if tier.syncing_stacks is None else tier.syncing_stacks,
            "current": tier.name == current.name}


def _chart(stacks: dict[str, Any], storage: dict[str, Any]) -> dict[str, Any] | None:
    """Share of each limit in use (percent): the one scale both limits have in common."""
    bars = [(label, gauge["percent"]) for label, gauge in (("Active stacks", stacks), ("Storage", storage))
            if gauge["percent"] is not None]
    if not bars:
        return None
    return {"type": "bar", "labels": [label for label, _ in bars],
            "datasets": [{"label": "In use (% of the limit)", "data": [value for _, value in bars]},
                         {"label": "Your plan's limit", "data": [100 for _ in bars]}],
            "y_label": "% of limit", "stacked": False, "max": 100}


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
    return render(request, "dashboard/billing/billing.html", {
        "organization": organization, "tier": tier, "stacks": stacks, "storage": storage,
        "archived": totals["archived"], "memories": int(totals["memories"] or 0),
        "tiers": [_tier_row(t, tier) for t in shown], "chart": _chart(stacks, storage),
    })
