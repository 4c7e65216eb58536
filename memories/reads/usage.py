"""A stack's storage and what it will cost (GET /api/v1/stacks/<stack>/usage; the student page).

* **Bytes by kind**: the stack's live memories (not deleted; forgotten ones still count, as they do
  for the quota) by kind, summed from `size_bytes` — what `Stack.bytes_used` counts for them — plus
  its workspace snapshots (teleport), which count in the same counter (docs/teleport.md §3).
* **Growth per month**: bytes of the stack's live memories by calendar month of their creation,
  for the last `MONTHS` months; the projection uses the last 90 days' bytes per 30 days (a rolling
  average that a young stack fills up as it ages). Snapshots are no growth: they expire within 30
  days, so they are a level, not a trend.
* **Cost**: the organization's storage in 30 days — today's total plus its own 90-day growth rate
  — priced on its tier with §12.7's overflow (billing.entitlements.monthly_cost_estimate). The
  organization's totals and prices are shown only to whom billing shows them
  (billing.entitlements.cost_visible_to: keys, admins, billing members — not teachers).

A few aggregate queries over the stack's rows, no per-memory Python; the organization's growth
rate is cached for 10 minutes (it reads the school's last 90 days of memories).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.core.cache import cache
from django.db.models import Count, Sum
from django.db.models.functions import TruncMonth
from django.utils import timezone

from accounts.principal import Principal
from billing.entitlements import cost_visible_to, monthly_cost_estimate, storage_used
from memories.models import Memory
from memoryhub.replica import read_alias
from stacks.models import Stack
from teleport.models import Snapshot

MONTHS = 6
WINDOW_DAYS = 90  # the projection's window
MONTH_DAYS = 30
ORG_GROWTH_CACHE_SECONDS = 600


def _month_starts(now: datetime, months: int) -> list[datetime]:
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    starts = [start]
    for _ in range(months - 1):
        start = (start - timedelta(days=1)).replace(day=1)
        starts.append(start)
    return starts[::-1]


def _growth_per_month(memories: Any, now: datetime) -> int:
    window = memories.filter(created_at__gte=now - timedelta(days=WINDOW_DAYS))
    added = int(window.aggregate(total=Sum("size_bytes"))["total"] or 0)
    return round(added * MONTH_DAYS / WINDOW_DAYS)


def _organization_growth(organization_id: int, now: datetime) -> int:
    """The organization's bytes per 30 days over the last 90 days. The one query here that reads
    other stacks' rows (a school's 90 days of memories), so it is kept for ORG_GROWTH_CACHE_SECONDS:
    a growth rate moves slowly, and the student page asks on every view."""
    key = f"usage:org-growth:{organization_id}"
    cached = cache.get(key)
    if isinstance(cached, int):
        return cached
    growth = _growth_per_month(Memory.objects.using(read_alias())
                               .filter(stack__organization_id=organization_id, deleted_at__isnull=True), now)
    cache.set(key, growth, ORG_GROWTH_CACHE_SECONDS)
    return growth


def stack_usage(*, stack: Stack, principal: Principal, now: datetime | None = None) -> dict[str, Any]:
    """The caller resolved `stack` through the access decision (read access)."""
    now = now or timezone.now()
    # Sums and series a moment old are fine: the replica, when there is one (memoryhub/replica.py).
    # The stack's own counter (`bytes_used`) is the row the caller's access check read, on the primary.
    alias = read_alias()
    live = Memory.objects.using(alias).filter(stack_id=stack.pk, deleted_at__isnull=True)
    by_kind = {row["kind"]: {"bytes": int(row["bytes"] or 0), "count": row["count"]}
               for row in live.values("kind").annotate(bytes=Sum("size_bytes"), count=Count("id")).order_by("kind")}
    snapshots = (Snapshot.objects.using(alias).filter(stack_id=stack.pk)
                 .aggregate(bytes=Sum("stored_bytes"), count=Count("id")))
    by_kind["snapshots"] = {"bytes": int(snapshots["bytes"] or 0), "count": snapshots["count"]}

    months = _month_starts(now, MONTHS)
    added = {row["month"].date(): int(row["bytes"] or 0)
             for row in live.filter(created_at__gte=months[0]).annotate(month=TruncMonth("created_at"))
             .values("month").annotate(bytes=Sum("size_bytes")).order_by("month")}
    growth = [{"month": start.strftime("%Y-%m"), "bytes": added.get(start.date(), 0)} for start in months]
    per_month = _growth_per_month(live, now)

    result: dict[str, Any] = {
        "stack": stack.slug,
        "bytes_used": stack.bytes_used,
        "bytes_by_kind": by_kind,
        "growth": growth,
        "growth_per_month": per_month,
        "projected_bytes_next_month": stack.bytes_used + per_month,
        "organization": None,
    }
    if cost_visible_to(principal):
        organization = stack.organization
        used = storage_used(organization=organization)
        org_growth = _organization_growth(organization.pk, now)
        result["organization"] = {
            "storage_used": used,
            "growth_per_month": org_growth,
            "projected_storage_next_month": used + org_growth,
            "cost_now": monthly_cost_estimate(organization=organization, storage_bytes=used),
            "projected_monthly_cost": monthly_cost_estimate(organization=organization,
                                                            storage_bytes=used + org_growth),
        }
    return result


def growth_chart(usage: dict[str, Any]) -> dict[str, Any]:
    """The dashboard chart's data (canvas[data-chart]) from a `stack_usage` answer. `empty`: nothing
    was added in these months, so the page says so in words instead of drawing bare axes."""
    data = [row["bytes"] for row in usage["growth"]]
    return {"type": "bar", "labels": [row["month"] for row in usage["growth"]],
            "datasets": [{"label": "Bytes added", "data": data}], "empty": not any(data)}
