"""The embedding pipeline's two stages (docs/algorithms.md §10.2): the model works on the next batch
while the previous one is stored, and an error anywhere leaves no claim behind."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest
from django.db import connection, transaction

from memories.models import Memory
from memories.search import embedding_jobs
from memories.search.embedding_jobs import memories_embed
from memories.search.embeddings import HashEmbedder
from memories.services import memory_create
from memories.writes import hooks
from stacks.models import Stack
from tests.factories import make_org, make_stack

pytestmark = pytest.mark.django_db(transaction=True)

BATCH = 4


@pytest.fixture(autouse=True)
def _small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedding_jobs, "EMBED_BATCH_SIZE", BATCH)
    # No embedding task is queued: the suite's Celery worker (when another module started it)
    # would embed the rows itself.
    monkeypatch.setattr(hooks, "_send_embedding", lambda ids, message_ids, **_: None)


def notes(stack: Any, count: int) -> list[str]:
    return [str(memory_create(stack=stack, kind="note", payload={"content": f"note number {i}"}, source="api").pk)
            for i in range(count)]


class StackLock:
    """Another connection holding the stack row's lock, as a long sync push does, until released."""

    def __init__(self, stack: Stack) -> None:
        self.stack_id = stack.pk
        self.taken, self.release = threading.Event(), threading.Event()
        self.held = False
        self.thread = threading.Thread(target=self._hold)

    def _hold(self) -> None:
        try:
            with transaction.atomic():
                Stack.objects.select_for_update().get(pk=self.stack_id)
                self.held = True
                self.taken.set()
                self.release.wait(5)
                self.held = False
        finally:
            connection.close()

    def __enter__(self) -> StackLock:
        self.thread.start()
        assert self.taken.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.thread.join(10)


def test_the_next_batch_is_embedded_while_the_previous_one_is_stored() -> None:
    stack = make_stack(make_org())
    ids = notes(stack, 2 * BATCH)
    seen: list[tuple[int, bool]] = []  # (texts, was the stack still locked when the model started)

    with StackLock(stack) as lock:

        class Embedder(HashEmbedder):
            def embed(self, texts: Sequence[str]) -> list[list[float]]:
                seen.append((len(texts), lock.held))
                if len(seen) == 2:
                    lock.release.set()  # the first batch's store may now take the lock and commit
                return super().embed(texts)

        result = memories_embed(ids=ids, embedder=Embedder())

    # The second batch reached the model while the first batch's store still waited for the
    # stack lock: storing no longer holds the model up (one after the other, the second batch
    # would only have started once the lock had lapsed, 5 s later).
    assert seen == [(BATCH, True), (BATCH, True)]
    assert result.embedded == 2 * BATCH
    stored = dict(Memory.objects.filter(pk__in=ids).values_list("text", "embedding"))
    for text, vector in stored.items():  # the vectors as computed (sent in binary, float32)
        assert list(vector) == pytest.approx(HashEmbedder().embed([text])[0], abs=1e-6)


def test_a_failing_batch_leaves_no_claim_and_loses_nothing() -> None:
    stack = make_stack(make_org())
    ids = notes(stack, 3 * BATCH)
    calls: list[int] = []

    class FailingSecondBatch(HashEmbedder):
        def embed(self, texts: Sequence[str]) -> list[list[float]]:
            calls.append(len(texts))
            if len(calls) == 2:
                raise RuntimeError("the model failed")
            return super().embed(texts)

    with pytest.raises(RuntimeError):
        memories_embed(ids=ids, embedder=FailingSecondBatch())
    # The first batch was stored; the failed one and the one behind it wait in the backlog.
    assert Memory.objects.filter(pk__in=ids, embedded_version__isnull=True).count() == 2 * BATCH
    # Nothing is left claimed: the next run embeds every row the failed one did not store.
    retry = memories_embed(ids=ids, embedder=HashEmbedder())
    assert (retry.embedded, retry.skipped_claimed) == (2 * BATCH, 0)
    assert Memory.objects.filter(pk__in=ids, embedded_version__isnull=True).count() == 0
