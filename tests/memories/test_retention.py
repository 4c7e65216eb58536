"""Retention per kind (docs/privacy.md "Retention policy"): each school keeps each memory kind for the
days it chose; the TTL job purges older rows of that kind in that school only; school admins read
and set the policy."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db.models import F
from django.utils import timezone

from accounts.models import AuditEvent, Organization, default_retention_days
from memories.lifecycle.ttl import DEFAULT_RETENTION_DAYS, retention_set, ttl_purge
from memories.models import Memory, MemoryKind
from stacks.models import Stack
from tests.actors import School
from tests.factories import bearer_client, make_key

pytestmark = pytest.mark.django_db


def _memory(stack: Stack, kind: str, record_id: str, age_days: int) -> Memory:
    created = timezone.now() - timedelta(days=age_days)
    memory = Memory.objects.create(stack=stack, kind=kind, record_id=record_id, text=record_id, created_at=created,
                                   server_updated_at=created, size_bytes=100)
    Stack.objects.filter(pk=stack.pk).update(memory_count=F("memory_count") + 1, bytes_used=F("bytes_used") + 100)
    return memory


def _records(stack: Stack) -> set[str]:
    return set(Memory.objects.filter(stack=stack).values_list("record_id", flat=True))


def _without_limits(organization: Organization) -> None:
    """A school created before the finite defaults: "no limit" for every kind, never reviewed."""
    Organization.objects.filter(pk=organization.pk).update(retention_days={}, retention_reviewed_at=None)


def test_ttl_job_purges_rows_older_than_the_schools_limit_for_that_kind(
        school: School, other_school: School, django_capture_on_commit_callbacks: Any) -> None:
    for stack in (school.stack, school.other_stack, other_school.stack):
        _memory(stack, "raw", f"{stack.slug}-old-raw", 400)
        _memory(stack, "raw", f"{stack.slug}-young-raw", 300)
        _memory(stack, "note", f"{stack.slug}-old-note", 400)
    retention_set(organization=school.org, policy={"raw": 365})
    _without_limits(other_school.org)

    with django_capture_on_commit_callbacks(execute=True):  # the counters move after commit
        run = ttl_purge()

    assert run.counts["retention_purged"] == 2
    assert _records(school.stack) == {"alice-young-raw", "alice-old-note"}  # other kinds untouched
    assert _records(school.other_stack) == {"bob-young-raw", "bob-old-note"}
    assert _records(other_school.stack) == {"carol-old-raw", "carol-young-raw", "carol-old-note"}  # other school
    stack = Stack.objects.get(pk=school.stack.pk)
    assert (stack.memory_count, stack.bytes_used) == (2, 200)  # counters moved with the purge
    assert ttl_purge().counts.get("retention_purged", 0) == 0  # idempotent


def test_retention_in_small_batches_purges_everything_due(school: School) -> None:
    for n in range(7):
        _memory(school.stack, "episode", f"old-{n}", 40)
    retention_set(organization=school.org, policy={"episode": 30})
    run = ttl_purge(batch_size=3)
    assert run.counts["retention_purged"] == 7
    assert _records(school.stack) == set()


def test_no_policy_keeps_everything(school: School) -> None:
    _without_limits(school.org)
    _memory(school.stack, "raw", "ancient", 10_000)
    ttl_purge()
    assert _records(school.stack) == {"ancient"}


def test_a_new_school_starts_with_a_limit_for_every_kind_and_the_job_enforces_them(
        school: School, django_capture_on_commit_callbacks: Any) -> None:
    assert set(default_retention_days()) == set(MemoryKind.values)  # accounts spells out memories' kinds
    days = Organization.objects.get(pk=school.org.pk).retention_days
    assert days == DEFAULT_RETENTION_DAYS and days["raw"] == 365
    assert all(days[kind] == 3 * 365 for kind in MemoryKind.values if kind != "raw")
    for kind in MemoryKind.values:
        _memory(school.stack, kind, f"{kind}-due", days[kind] + 1)
        _memory(school.stack, kind, f"{kind}-kept", days[kind] - 1)

    with django_capture_on_commit_callbacks(execute=True):
        run = ttl_purge()

    assert run.counts["retention_purged"] == len(MemoryKind.values)
    assert _records(school.stack) == {f"{kind}-kept" for kind in MemoryKind.values}


def test_admin_reads_and_sets_retention_through_the_api(school: School, other_school: School) -> None:
    response = school.admin_api.get("/api/v1/retention")
    assert response.status_code == 200 and response.json() == {"retention_days": DEFAULT_RETENTION_DAYS}
    response = school.admin_api.put("/api/v1/retention", {"retention_days": {"raw": 365, "episode": 730}},
                                    format="json")
    assert response.status_code == 200, response.content
    assert Organization.objects.get(pk=school.org.pk).retention_days == {"raw": 365, "episode": 730}
    assert Organization.objects.get(pk=other_school.org.pk).retention_days == DEFAULT_RETENTION_DAYS
    assert AuditEvent.objects.filter(organization=school.org, action="retention.updated").exists()
    assert school.admin_api.get("/api/v1/retention").json() == {"retention_days": {"raw": 365, "episode": 730}}


@pytest.mark.parametrize("policy,field", [
    ({"rawz": 365}, "rawz"),
    ({"raw": 0}, "raw"),
    ({"raw": -3}, "raw"),
    ({"raw": "365"}, "raw"),
    ({"raw": True}, "raw"),
    ({"raw": 10**9}, "raw"),
    ([365], "retention_days"),
    (None, "retention_days"),
])
def test_invalid_policies_are_a_clear_400(school: School, policy: Any, field: str) -> None:
    response = school.admin_api.put("/api/v1/retention", {"retention_days": policy}, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "invalid_retention"
    assert field in response.json()["error"]["fields"]
    assert Organization.objects.get(pk=school.org.pk).retention_days == DEFAULT_RETENTION_DAYS


def test_agent_and_read_only_keys_may_not_set_retention(school: School) -> None:
    body = {"retention_days": {"raw": 1}}
    assert school.agent.put("/api/v1/retention", body, format="json").status_code == 403
    _, secret = make_key(school.org, user=school.admin, read_only=True)
    assert bearer_client(secret).put("/api/v1/retention", body, format="json").status_code == 403
    assert Organization.objects.get(pk=school.org.pk).retention_days == DEFAULT_RETENTION_DAYS
