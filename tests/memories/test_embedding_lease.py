"""Embedding claims are leases: renewed while a worker embeds, lapsing within seconds when the worker
dies, so a killed worker's batch is embedded by the next task or sweep instead of waiting minutes."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from memories.models import Memory
from memories.search import embedding_claims
from memories.search.embedding_claims import claim
from memories.search.embedding_jobs import memories_embed
from memories.search.embeddings import get_embedder
from memories.services import memory_create
from memories.writes import hooks
from tests.factories import make_org, make_stack

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _short_leases(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedding_claims, "CLAIM_SECONDS", 1)
    monkeypatch.setattr(embedding_claims, "RENEW_SECONDS", 0.2)
    # These writes queue no embedding task: the suite's Celery worker (when another module started
    # it) would embed the rows itself while the test holds or waits for their claims.
    monkeypatch.setattr(hooks, "_send_embedding", lambda ids, message_ids, **_: None)


class SlowEmbedder:
    """The suite's embedder, taking `seconds` per batch (a big batch on a busy CPU)."""

    def __init__(self, seconds: float) -> None:
        self.inner = get_embedder()
        self.seconds = seconds
        self.name, self.dimensions = self.inner.name, self.inner.dimensions

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    def embed(self, texts: Sequence[str]) -> list[Any]:
        time.sleep(self.seconds)
        return self.inner.embed(texts)


def note(text: str) -> Memory:
    return memory_create(stack=make_stack(make_org()), kind="note", payload={"content": text}, source="api")


def test_a_claim_is_renewed_while_its_batch_is_embedded() -> None:
    memory = note("a slow batch")
    worker = threading.Thread(target=lambda: memories_embed(ids=[memory.pk], embedder=SlowEmbedder(2.5)))
    worker.start()
    time.sleep(1.8)  # past the 1 s lease: only renewal keeps it
    second = memories_embed(ids=[memory.pk])
    worker.join(10)
    assert (second.embedded, second.skipped_claimed) == (0, 1)
    memory.refresh_from_db()
    assert memory.embedded_version == memory.version  # the first worker finished the job


def test_a_dead_workers_claim_lapses_within_seconds() -> None:
    memory = note("claimed by a worker that was killed")
    assert claim([str(memory.pk)], "killed-worker") == [str(memory.pk)]  # claimed, never renewed
    assert memories_embed(ids=[memory.pk]).skipped_claimed == 1
    time.sleep(1.3)
    assert memories_embed(ids=[memory.pk]).embedded == 1
