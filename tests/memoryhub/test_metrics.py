"""/metrics: Prometheus exposition of what the service does, readable with the token or from this
machine only, and the counters move when agents work."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from memories.models import Memory
from memories.search.embedding_jobs import memories_embed
from memories.search.embeddings import get_embedder
from memoryhub import health
from tests.actors import School

pytestmark = pytest.mark.django_db

TOKEN = "metrics-token-for-tests"


def scrape(client: Client, **extra: Any) -> str:
    response = client.get("/metrics", **extra)
    assert response.status_code == 200, response.status_code
    assert response["Content-Type"].startswith("text/plain")
    return response.content.decode()


def value(text: str, name: str, **labels: str) -> float:
    """The sample `name{labels…}` (labels in any order), 0 when absent."""
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}(?:{{(.*)}})? (\S+)", line)
        if match and all(f'{k}="{v}"' in (match.group(1) or "") for k, v in labels.items()):
            return float(match.group(2))
    return 0.0


@pytest.mark.parametrize("extra", [
    {"REMOTE_ADDR": "10.0.0.7"},  # another machine
    {"REMOTE_ADDR": "203.0.113.9", "HTTP_AUTHORIZATION": "Bearer wrong-token"},
    {"REMOTE_ADDR": "127.0.0.1", "HTTP_X_FORWARDED_FOR": "203.0.113.9"},  # relayed by a local proxy
])
def test_metrics_are_not_readable_from_elsewhere_without_the_token(settings: Any, extra: dict[str, Any]) -> None:
    settings.METRICS_TOKEN = TOKEN
    response = Client().get("/metrics", **extra)
    assert response.status_code == 404
    assert b"memoryhub_" not in response.content


def test_metrics_are_readable_with_the_token_from_anywhere_and_from_loopback(settings: Any) -> None:
    settings.METRICS_TOKEN = TOKEN
    assert "memoryhub_http_requests" in scrape(Client(), REMOTE_ADDR="203.0.113.9",
                                               HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert "memoryhub_http_requests" in scrape(Client())  # the test client is 127.0.0.1


def test_without_a_configured_token_no_bearer_opens_it(settings: Any) -> None:
    settings.METRICS_TOKEN = ""
    assert Client().get("/metrics", REMOTE_ADDR="10.0.0.7", HTTP_AUTHORIZATION="Bearer ").status_code == 404


def test_counters_move_when_agents_work(school: School) -> None:
    client = Client()
    before = scrape(client)
    stamp = "2026-11-24T10:00:00+00:00"
    operations = [{"operation": "update", "table": "notes", "record_id": str(uuid.uuid4()), "local_updated_at": stamp,
                   "data": {"content": f"Note {n}", "local_updated_at": stamp}} for n in range(3)]
    operations.append({"operation": "update", "table": "notes", "record_id": "x", "data": "not an object"})
    pushed = school.agent.post("/sync/push", {"stack_id": school.stack.slug, "operations": operations}, format="json")
    assert pushed.status_code == 200, pushed.content
    searched = school.agent.post(school.stack_url("search"), {"query": "note"}, format="json")
    assert searched.status_code == 200, searched.content

    after = scrape(client)
    route = "/sync/push"
    assert value(after, "memoryhub_http_requests_total", route=route, method="POST", status="200") == \
        value(before, "memoryhub_http_requests_total", route=route, method="POST", status="200") + 1
    assert value(after, "memoryhub_sync_push_operations_total", protocol="kernle", outcome="applied") - \
        value(before, "memoryhub_sync_push_operations_total", protocol="kernle", outcome="applied") == 3
    assert value(after, "memoryhub_sync_push_operations_total", protocol="kernle", outcome="conflict") - \
        value(before, "memoryhub_sync_push_operations_total", protocol="kernle", outcome="conflict") == 1
    searches = "memoryhub_search_duration_seconds_count"
    assert value(after, searches) == value(before, searches) + 1
    assert value(after, "memoryhub_embedding_backlog") >= 3  # the new notes await their vectors
    # Labels are route patterns: no stack slug, memory text or id appears anywhere.
    assert school.stack.slug not in after and "Note 1" not in after


def test_the_embedding_lag_is_how_long_the_oldest_memory_has_waited_for_its_vector(school: School) -> None:
    client = Client()
    created = [school.agent.post(school.stack_url("memories"), {"kind": "note", "content": f"Lag note {n}"},
                                 format="json") for n in range(2)]
    assert [response.status_code for response in created] == [201, 201]
    oldest, newest = (Memory.objects.get(pk=response.json()["id"]) for response in created)
    Memory.objects.filter(pk=oldest.pk).update(server_updated_at=timezone.now() - timedelta(minutes=10))
    scraped = scrape(client)
    assert 600 <= value(scraped, "memoryhub_embedding_lag_seconds") < 660
    assert value(scraped, "memoryhub_embedding_backlog") >= 2

    memories_embed(ids=[oldest.pk, newest.pk], embedder=get_embedder())
    scraped = scrape(client)
    assert value(scraped, "memoryhub_embedding_backlog") == 0
    assert value(scraped, "memoryhub_embedding_lag_seconds") == 0  # nothing awaits: no lag
    assert 'memoryhub_embedding_lag_seconds 0.0' in scraped  # present, not merely absent


def test_the_backlog_is_counted_up_to_its_cap_and_the_lag_still_finds_the_oldest(
        school: School, monkeypatch: pytest.MonkeyPatch) -> None:
    """/metrics and /readyz count the backlog no further than BACKLOG_COUNT_CAP, so a large import
    never makes the probe slower; the lag still reads the oldest awaiting change (docs/operations.md §11)."""
    monkeypatch.setattr(health, "BACKLOG_COUNT_CAP", 2)
    created = [school.agent.post(school.stack_url("memories"), {"kind": "note", "content": f"Capped note {n}"},
                                 format="json") for n in range(3)]
    assert [response.status_code for response in created] == [201, 201, 201]
    oldest = Memory.objects.get(pk=created[-1].json()["id"])  # the last written, made the oldest
    Memory.objects.filter(pk=oldest.pk).update(server_updated_at=timezone.now() - timedelta(minutes=10))
    scraped = scrape(Client())
    assert value(scraped, "memoryhub_embedding_backlog") == 2
    assert 600 <= value(scraped, "memoryhub_embedding_lag_seconds") < 660
    readiness = Client().get("/readyz").json()
    assert readiness["embedding_backlog"] == 2 and readiness["embedding_backlog_capped"] is True
