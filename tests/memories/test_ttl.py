"""TTL: expired memories vanish from every read at their time, and the purge job removes them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db.models import F
from django.utils import timezone

from memories import selectors
from memories.lifecycle.decay_pass import decay_pass, forgetting_candidates
from memories.lifecycle.ttl import ttl_purge
from memories.models import JobRun, Memory, MemoryRevision
from stacks.models import Stack
from tests.factories import bearer_client, make_key, make_org, make_stack

pytestmark = pytest.mark.django_db


def make_memory(stack: Stack, record_id: str, **fields: Any) -> Memory:
    now = timezone.now()
    memory = Memory.objects.create(stack=stack, kind="note", record_id=record_id, text=record_id, created_at=now,
                                   server_updated_at=now, size_bytes=100, **fields)
    Stack.objects.filter(pk=stack.pk).update(memory_count=F("memory_count") + 1, bytes_used=F("bytes_used") + 100)
    return memory


@pytest.fixture
def stack() -> Stack:
    return make_stack(make_org())


def test_expired_memory_disappears_from_reads_at_its_time(stack):
    expiry = timezone.now() + timedelta(hours=1)
    make_memory(stack, "keeps")
    ttl = make_memory(stack, "short-lived", expires_at=expiry)

    def visible(at) -> set[str]:
        return set(selectors.memories_live(stack=stack, now=at).values_list("record_id", flat=True))

    assert visible(expiry - timedelta(seconds=1)) == {"keeps", "short-lived"}
    assert visible(expiry) == {"keeps"}  # gone at its time, before any purge
    assert Memory.objects.filter(pk=ttl.pk).exists()
    # The decay pass neither scores nor forgets an expired row; the candidates list skips it.
    make_memory(stack, "old-and-expired", expires_at=expiry)
    Memory.objects.filter(record_id="old-and-expired").update(created_at=F("created_at") - timedelta(days=400))
    assert forgetting_candidates(stack=stack, now=expiry) == []
    assert decay_pass(now=expiry).counts["forgotten"] == 0


def test_expired_memories_are_gone_from_the_api(stack):
    _, secret = make_key(stack.organization, stack=stack)
    client = bearer_client(secret)
    make_memory(stack, "still-here", expires_at=timezone.now() + timedelta(days=1))
    gone = make_memory(stack, "expired", expires_at=timezone.now() - timedelta(seconds=1))
    listing = client.get(f"/api/v1/stacks/{stack.slug}/memories")
    assert listing.status_code == 200
    assert [m["record_id"] for m in listing.json()["results"]] == ["still-here"]
    assert client.get(f"/api/v1/stacks/{stack.slug}/memories/{gone.pk}").status_code == 404
    recall = client.post(f"/api/v1/stacks/{stack.slug}/memories/{gone.pk}/recall", {}, format="json")
    assert recall.status_code == 404


def test_purge_deletes_expired_rows_with_their_revisions_and_frees_usage(stack, django_capture_on_commit_callbacks):
    now = timezone.now()
    keep = make_memory(stack, "keep", expires_at=now + timedelta(minutes=5))
    expired = [make_memory(stack, f"expired-{i}", expires_at=now - timedelta(minutes=i)) for i in range(5)]
    MemoryRevision.objects.create(memory=expired[0], version=1, source="api", action="update", snapshot={})
    other_stack = make_stack(stack.organization)
    make_memory(other_stack, "other-expired", expires_at=now - timedelta(days=1))
    Memory.objects.filter(record_id="expired-4").update(deleted_at=now)  # soft-deleted: not counted any more
    Stack.objects.filter(pk=stack.pk).update(memory_count=F("memory_count") - 1, bytes_used=F("bytes_used") - 100)

    with django_capture_on_commit_callbacks(execute=True):
        run = ttl_purge(now=now, batch_size=2)

    assert run.status == JobRun.Status.SUCCEEDED
    assert run.counts == {"purged": 6, "batches": 3}
    assert set(Memory.objects.values_list("record_id", flat=True)) == {"keep"}
    assert not MemoryRevision.objects.exclude(memory=keep).exists()
    stack.refresh_from_db()
    other_stack.refresh_from_db()
    assert (stack.memory_count, stack.bytes_used) == (1, 100)
    assert (other_stack.memory_count, other_stack.bytes_used) == (0, 0)

    again = ttl_purge(now=now)
    assert again.counts == {"purged": 0, "batches": 0}
    assert Memory.objects.filter(pk=keep.pk).exists()


def test_purge_also_forgets_job_runs_older_than_a_month():
    old = JobRun.objects.create(name="decay", status=JobRun.Status.SUCCEEDED)
    JobRun.objects.filter(pk=old.pk).update(started_at=timezone.now() - timedelta(days=31))
    recent = JobRun.objects.create(name="decay", status=JobRun.Status.SUCCEEDED)
    run = ttl_purge()
    assert run.counts == {"purged": 0, "batches": 0, "job_runs_pruned": 1}
    assert set(JobRun.objects.values_list("pk", flat=True)) == {recent.pk, run.pk}
