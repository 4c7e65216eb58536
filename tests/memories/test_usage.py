"""GET /api/v1/stacks/<stack>/usage (memories/reads/usage.py): bytes by kind add up to what the quota
counts (memories and teleport snapshots), growth per calendar month, and the projected monthly cost
on the organization's tier with §12.7's overflow prices (docs/kernle-protocol.md); the
organization's totals only for whom billing shows them; other schools and stacks get 404."""

from __future__ import annotations

import io
import tarfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from pytest_django.fixtures import SettingsWrapper

from accounts.models import Organization
from accounts.principal import Principal
from accounts.tiers import GB, MB
from memories.models import Memory
from memories.reads.usage import MONTHS, growth_chart
from memories.services import memory_create
from stacks.models import Stack
from teleport.services import snapshot_create
from tests.actors import School
from tests.factories import session_client

pytestmark = pytest.mark.django_db


def _usage(client: Any, school: School, slug: str | None = None) -> Any:
    return client.get(f"/api/v1/stacks/{slug or school.stack.slug}/usage")


def _note(school: School, text: str, *, days_ago: int = 0) -> Memory:
    memory = memory_create(stack=school.stack, kind="note", payload={"content": text}, source="api")
    if days_ago:
        Memory.objects.filter(pk=memory.pk).update(created_at=timezone.now() - timedelta(days=days_ago))
    return memory


def test_bytes_by_kind_add_up_to_the_quota_counter(school: School, settings: SettingsWrapper, tmp_path: Path) -> None:
    settings.TELEPORT_DIR = tmp_path
    notes = [_note(school, "Fractions click with pizza diagrams " * n) for n in (1, 5)]
    belief = memory_create(stack=school.stack, kind="belief", payload={"statement": "Pictures help"}, source="api")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("plan.md")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"hello"))
    snapshot = snapshot_create(stack=school.stack, principal=Principal(user=school.admin, organization=school.org),
                               upload=buffer.getvalue())

    answer = _usage(school.agent, school)
    assert answer.status_code == 200, answer.json()
    body = answer.json()
    assert body["bytes_by_kind"]["note"] == {"bytes": sum(n.size_bytes for n in notes), "count": 2}
    assert body["bytes_by_kind"]["belief"] == {"bytes": belief.size_bytes, "count": 1}
    assert body["bytes_by_kind"]["snapshots"] == {"bytes": snapshot.stored_bytes, "count": 1}
    total = sum(entry["bytes"] for entry in body["bytes_by_kind"].values())
    assert total == body["bytes_used"] == Stack.objects.get(pk=school.stack.pk).bytes_used


def test_growth_per_month_and_projection(school: School) -> None:
    now = timezone.now()
    recent = _note(school, "this month")
    older = _note(school, "two months back, give or take", days_ago=62)
    ancient = _note(school, "a year ago, outside every window", days_ago=365)
    body = _usage(school.agent, school).json()
    growth = body["growth"]
    assert len(growth) == MONTHS
    assert growth[-1]["month"] == now.strftime("%Y-%m")
    assert sum(row["bytes"] for row in growth) == recent.size_bytes + older.size_bytes  # a year ago is outside
    assert growth[-1]["bytes"] >= recent.size_bytes
    in_window = recent.size_bytes + older.size_bytes  # the last 90 days
    assert body["growth_per_month"] == round(in_window * 30 / 90)
    assert body["projected_bytes_next_month"] == body["bytes_used"] + body["growth_per_month"]
    assert ancient.size_bytes > 0
    chart = growth_chart(body)
    assert chart["labels"] == [row["month"] for row in growth]


def _set_tier(school: School, tier: str) -> None:
    Organization.objects.filter(pk=school.org.pk).update(tier=tier)


def test_projected_cost_on_a_tier_with_overflow(school: School) -> None:
    _note(school, "growth " * 50)
    _set_tier(school, "core")  # 100 MB, $5, $0.50 per started GB over
    Stack.objects.filter(pk=school.other_stack.pk).update(bytes_used=100 * MB + GB + 1)  # 2 started GB over
    body = _usage(school.agent, school).json()
    organization = body["organization"]
    assert organization["storage_used"] == 100 * MB + GB + 1 + body["bytes_used"]
    cost = organization["cost_now"]
    assert cost["tier"] == "core" and cost["currency"] == "USDC"
    assert (cost["price"], cost["overflow"], cost["total"]) == ("5", "1", "6")
    assert cost["overflow_prices"] == {"per_gb": "0.5", "per_stack": "1.5"}
    assert cost["over_limit"] is True and cost["overflow_billed"] is False  # no paid subscription: refused instead
    projected = organization["projected_monthly_cost"]
    assert projected["storage_bytes"] == organization["projected_storage_next_month"]
    assert organization["projected_storage_next_month"] == \
        organization["storage_used"] + organization["growth_per_month"]


@pytest.mark.parametrize(("tier", "price", "total", "overflow_prices"), [
    ("free", "0", "0", None), ("pro", "15", "15", {"per_gb": "0.5", "per_stack": "1"}),
    ("enterprise", None, None, None)])
def test_cost_by_tier(school: School, tier: str, price: str | None, total: str | None,
                      overflow_prices: dict[str, str] | None) -> None:
    _set_tier(school, tier)
    cost = _usage(school.agent, school).json()["organization"]["cost_now"]
    assert (cost["price"], cost["total"], cost["overflow_prices"]) == (price, total, overflow_prices)
    assert cost["over_limit"] is False


def test_teachers_see_the_stack_but_not_the_schools_bill(school: School) -> None:
    body = _usage(session_client(school.teacher), school).json()
    assert body["stack"] == school.stack.slug and body["organization"] is None
    assert _usage(session_client(school.admin), school).json()["organization"] is not None


def test_other_schools_and_stacks_get_404(school: School, other_school: School) -> None:
    assert _usage(other_school.agent, school).status_code == 404
    assert _usage(other_school.admin_api, school).status_code == 404
    assert _usage(school.agent, school, school.other_stack.slug).status_code == 404
    assert _usage(session_client(school.teacher), school, school.other_stack.slug).status_code == 404
