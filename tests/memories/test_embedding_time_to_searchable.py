"""Time to searchable (docs/algorithms.md §10.2.3): each stored vector's wait from its memory's
acknowledged write, on /metrics as a histogram and as the recent p50/p95 that any process reads from
Redis, the worker's included; and keyword search, which finds a new memory before any vector."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.test import Client
from django.utils import timezone

from memories.models import Memory
from memories.search.embedding_jobs import memories_embed
from memories.search.embeddings import get_embedder
from memories.services import memory_create
from memoryhub import time_to_searchable
from tests.actors import School
from tests.factories import make_org, make_stack
from tests.memoryhub.test_metrics import scrape, value

HISTOGRAM = "memoryhub_time_to_searchable_seconds"
RECENT = "memoryhub_time_to_searchable_recent_seconds"
SAMPLES = "memoryhub_time_to_searchable_recent_samples"


def forget_recent(*organization_ids: int) -> None:
    """This session's Redis outlives each test's rows: start from no recent sample."""
    keys = [time_to_searchable._SERVICE_KEY, *(time_to_searchable._school_key(i) for i in organization_ids)]
    time_to_searchable._redis().delete(*keys)


@pytest.mark.django_db
def test_each_stored_vector_counts_its_wait_from_the_acknowledged_write(school: School) -> None:
    forget_recent(school.org.pk)
    client = Client()
    before = scrape(client)
    created = school.agent.post(school.stack_url("memories"), {"kind": "note", "content": "waited a while"},
                                format="json")
    assert created.status_code == 201, created.content
    # The worker was behind: the write was acknowledged 90 s before its vector is stored.
    Memory.objects.filter(pk=created.json()["id"]).update(server_updated_at=timezone.now() - timedelta(seconds=90))

    assert memories_embed(ids=[created.json()["id"]], embedder=get_embedder()).embedded == 1

    after = scrape(client)
    assert value(after, f"{HISTOGRAM}_count") == value(before, f"{HISTOGRAM}_count") + 1
    assert 90 <= value(after, f"{HISTOGRAM}_sum") - value(before, f"{HISTOGRAM}_sum") < 120
    assert value(after, f"{HISTOGRAM}_bucket", le="60.0") == value(before, f"{HISTOGRAM}_bucket", le="60.0")
    assert value(after, f"{HISTOGRAM}_bucket", le="120.0") == value(before, f"{HISTOGRAM}_bucket", le="120.0") + 1
    assert value(after, SAMPLES) == 1
    assert 90 <= value(after, RECENT, quantile="0.95") < 120
    # The school's own recent samples, for its dashboard: the stack, never the memory.
    [(stack_id, seconds)] = time_to_searchable.recent(school.org.pk)
    assert stack_id == school.stack.pk and 90 <= seconds < 120
    assert time_to_searchable.recent(school.org.pk + 1_000_000) == []


@pytest.mark.django_db
def test_no_vector_stored_lately_states_no_quantile(school: School) -> None:
    forget_recent()
    scraped = scrape(Client())
    assert f"{SAMPLES} 0.0" in scraped  # present, and zero
    assert f"{RECENT}{{" not in scraped


@pytest.mark.django_db
def test_a_model_switchs_re_embedding_of_an_old_memory_is_not_counted(school: School) -> None:
    """A vector replacing another model's is the switch's work on a memory written long ago, not a
    new memory waiting for the worker: counting it would report days."""
    forget_recent(school.org.pk)
    memory = memory_create(stack=school.stack, kind="note", payload={"content": "written last year"}, source="api")
    Memory.objects.filter(pk=memory.pk).update(
        embedding=[1.0] + [0.0] * 383, embedding_model="an-older-model/384", embedded_version=memory.version,
        server_updated_at=timezone.now() - timedelta(days=365))
    client = Client()
    before = scrape(client)

    assert memories_embed(ids=[memory.pk], embedder=get_embedder()).embedded == 1

    after = scrape(client)
    assert value(after, f"{HISTOGRAM}_count") == value(before, f"{HISTOGRAM}_count")
    assert value(after, SAMPLES) == 0 and time_to_searchable.recent(school.org.pk) == []


@pytest.mark.django_db
def test_keyword_search_finds_a_new_memory_before_its_vector_is_stored(school: School) -> None:
    """What the overview promises while the worker is behind: a memory is found by keyword search
    right after its write is acknowledged, with no vector yet (no worker consumes here)."""
    created = school.agent.post(school.stack_url("memories"),
                                {"kind": "note", "content": "Xylophone rehearsal moved to Thursday"}, format="json")
    assert created.status_code == 201, created.content
    assert Memory.objects.get(pk=created.json()["id"]).embedded_version is None  # not searchable by meaning yet

    found = school.agent.post(school.stack_url("search"), {"query": "xylophone rehearsal"}, format="json")

    assert found.status_code == 200, found.content
    [hit] = found.json()["results"]
    assert hit["id"] == created.json()["id"]
    assert hit["match_type"] == "keyword" and hit["semantic_score"] is None


@pytest.mark.django_db(transaction=True)
def test_a_vector_the_worker_process_stored_shows_on_the_web_processs_metrics(celery_worker: Any) -> None:
    """The worker is a process of its own: its samples reach /metrics and the dashboard through Redis."""
    stack = make_stack(make_org())
    forget_recent(stack.organization_id)
    with transaction.atomic():
        memory = memory_create(stack=stack, kind="note", payload={"content": "embedded elsewhere"}, source="api")
    deadline = time.monotonic() + 30
    while Memory.objects.filter(pk=memory.pk, embedded_version__isnull=True).exists():
        assert time.monotonic() < deadline, "the worker stored no vector"
        time.sleep(0.1)

    scraped = scrape(Client())
    assert value(scraped, SAMPLES) == 1
    assert 0 <= value(scraped, RECENT, quantile="0.95") < 30
    assert [stack_id for stack_id, _ in time_to_searchable.recent(stack.organization_id)] == [stack.pk]
