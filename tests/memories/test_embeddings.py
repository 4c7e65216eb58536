"""Embedding providers, the embedding jobs (claims, version guard, sweep, re-embed) and the worker path."""

from __future__ import annotations

import base64
import json
import math
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, cast

import kombu.compression
import pytest
import redis
from django.conf import settings
from django.core.management import call_command
from django.db import connection, transaction

from memories.models import ChangeEvent, Memory
from memories.search.embedding_backlog import (
    embedding_backlog_count,
    embedding_sweep,
    embeddings_invalidate_stale_model,
)
from memories.search.embedding_claims import claim, release
from memories.search.embedding_jobs import memories_embed
from memories.search.embedding_store import store_vectors
from memories.search.embeddings import (
    HashEmbedder,
    OpenAIEmbedder,
    embed_query,
    get_embedder,
    query_cache,
    vector_literal,
)
from memories.services import memory_batch_create, memory_create, memory_update
from memories.writes.hooks import SMALL_EMBED_MESSAGE_IDS
from memoryhub.errors import ServiceUnavailable
from memoryhub.schedule import EMBEDDING_QUEUE
from tests.factories import make_org, make_stack


def note(stack: Any, content: str) -> Memory:
    return memory_create(stack=stack, kind="note", payload={"content": content}, source="api")


def test_hash_embedder_is_deterministic_unit_length_and_lexical() -> None:
    embedder = HashEmbedder()
    a, b, c = embedder.embed(["fractions with pizza", "fractions with pizza", "the museum trip"])
    assert a == b
    assert len(a) == 384
    assert math.isclose(sum(x * x for x in a), 1.0, rel_tol=1e-9)
    cosine = sum(x * y for x, y in zip(a, c, strict=True))
    assert cosine < 0.5
    assert embedder.model_id == "hash-v1/384"
    assert embedder.embed([""])[0] == [0.0] * 384


@pytest.mark.django_db
def test_a_vector_literal_is_read_by_pgvector_as_the_values_it_was_made_from() -> None:
    vector = [0.1234567891, -0.5, 0.0, 1e-9, -3.0e-5, 12345.678, 1.0, -1.0]
    assert vector_literal(vector) == "[0.1234568,-0.5,0,1e-09,-3e-05,12345.68,1,-1]"
    assert vector_literal([]) == "[]"
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::vector::real[]", [vector_literal(vector)])
        (stored,) = cursor.fetchone()
    assert stored == pytest.approx(vector, rel=1e-6, abs=1e-12)  # 7 significant digits


def test_query_embeddings_are_cached() -> None:
    query_cache.clear()
    first = embed_query("how does alice learn")
    assert embed_query("how does alice learn ") is first  # same text after strip: the cached vector


@pytest.mark.django_db
def test_embed_records_model_and_version_and_is_idempotent() -> None:
    stack = make_stack(make_org())
    memory = note(stack, "alice likes fractions")
    assert embedding_backlog_count() == 1
    result = memories_embed(ids=[memory.pk, memory.pk])
    assert result.embedded == 1
    memory.refresh_from_db()
    assert memory.embedded_version == memory.version
    assert memory.embedding_model == "hash-v1/384"
    assert list(memory.embedding) == pytest.approx(get_embedder().embed([memory.text])[0], abs=1e-6)
    assert embedding_backlog_count() == 0
    assert memories_embed(ids=[memory.pk]).embedded == 0  # nothing left to do


@pytest.mark.django_db
def test_changed_text_goes_back_to_the_backlog_and_a_stale_vector_is_not_recorded() -> None:
    stack = make_stack(make_org())
    memory = note(stack, "first text")
    memories_embed(ids=[memory.pk])
    memory = memory_update(memory=memory, payload={"content": "second text"}, source="api")
    assert Memory.objects.get(pk=memory.pk).embedded_version is None
    # A vector computed from an old version must not be stored as current.
    stored = store_vectors([(str(memory.pk), memory.version - 1)], [[1.0] + [0.0] * 383], "hash-v1/384")
    assert stored == 0
    assert memories_embed(ids=[memory.pk]).embedded == 1
    assert Memory.objects.get(pk=memory.pk).embedded_version == memory.version


@pytest.mark.django_db
def test_a_row_claimed_by_another_worker_is_skipped() -> None:
    stack = make_stack(make_org())
    a, b = note(stack, "row a"), note(stack, "row b")
    assert claim([str(a.pk)], "other-worker") == [str(a.pk)]
    result = memories_embed(ids=[a.pk, b.pk])
    assert (result.embedded, result.skipped_claimed) == (1, 1)
    assert Memory.objects.get(pk=a.pk).embedded_version is None
    release([str(a.pk)], "other-worker")
    assert memories_embed(ids=[a.pk]).embedded == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_embedders_never_embed_the_same_row_twice() -> None:
    stack = make_stack(make_org())
    ids = [note(stack, f"row {i}").pk for i in range(30)]

    class CountingEmbedder(HashEmbedder):
        seen: list[str] = []

        def embed(self, texts: Any) -> list[list[float]]:
            time.sleep(0.05)  # widen the window in which both workers hold claims
            self.seen.extend(texts)
            return super().embed(texts)

    embedder = CountingEmbedder()
    results: list[Any] = []

    def run() -> None:
        try:
            results.append(memories_embed(ids=ids, embedder=embedder))
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(embedder.seen) == len(set(embedder.seen))  # neither thread embedded a row the other did
    # The commit queued the rows for the suite's Celery worker too, when an earlier test started it:
    # a third embedder. Once every row has its vector, each was stored exactly once, by whoever
    # claimed it: one "embedded" change event names each row once.
    deadline = time.monotonic() + 30
    while Memory.objects.filter(pk__in=ids, embedded_version__isnull=True).exists():
        assert time.monotonic() < deadline, "rows left without a vector"
        time.sleep(0.1)
    stored = Counter(i for e in ChangeEvent.objects.filter(stack=stack, action="embedded") for i in e.memory_ids)
    assert stored == Counter({str(i): 1 for i in ids})
    assert sum(r.embedded for r in results) == len(embedder.seen)


@pytest.mark.django_db
def test_sweep_embeds_everything_missed_and_invalidation_requeues_other_models() -> None:
    stack = make_stack(make_org())
    for i in range(150):
        note(stack, f"missed {i}")
    assert embedding_backlog_count() == 150
    result = embedding_sweep(max_rows=1000)
    assert result.embedded == 150
    assert embedding_backlog_count() == 0
    # A model change: rows made by another model go back to the backlog, nothing else does.
    Memory.objects.filter(pk__in=Memory.objects.values("pk")[:10]).update(embedding_model="old-model/384")
    assert embeddings_invalidate_stale_model() == 10
    assert embedding_backlog_count() == 10


@pytest.mark.django_db
def test_reembed_command_redoes_other_models_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    stack = make_stack(make_org())
    memories = [note(stack, f"text {i}") for i in range(5)]
    memories_embed(ids=[m.pk for m in memories])
    Memory.objects.filter(pk=memories[0].pk).update(embedding_model="old-model/384")
    call_command("reembed")
    out = capsys.readouterr().out
    assert "1 marked for re-embedding" in out
    assert "0 awaiting" in out
    assert set(Memory.objects.values_list("embedding_model", flat=True)) == {"hash-v1/384"}
    call_command("reembed", "--all")
    assert "5 marked" in capsys.readouterr().out


# --- the OpenAI-compatible provider, against a local HTTP server ------------------------------------

class _Handler(BaseHTTPRequestHandler):
    requests: list[dict[str, Any]] = []
    dimensions = 384

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        data = [{"index": i, "embedding": [float(i + 1)] + [0.0] * (self.dimensions - 1)}
                for i, _ in enumerate(body["input"])]
        payload = json.dumps({"data": list(reversed(data)), "model": body["model"]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def embeddings_server() -> Iterator[str]:
    _Handler.requests = []
    _Handler.dimensions = 384
    server = HTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_openai_provider_batches_orders_and_normalises(embeddings_server: str) -> None:
    embedder = OpenAIEmbedder(url=embeddings_server, api_key="sk-test", model="text-embedding-3-small")
    vectors = embedder.embed([f"t{i}" for i in range(150)])
    assert len(vectors) == 150
    assert all(v[0] == pytest.approx(1.0) for v in vectors)  # normalised
    assert [len(r["body"]["input"]) for r in _Handler.requests] == [100, 50]
    first = _Handler.requests[0]
    assert first["path"] == "/v1/embeddings"
    assert first["auth"] == "Bearer sk-test"
    assert first["body"]["dimensions"] == 384
    assert embedder.model_id == "text-embedding-3-small/384"


def test_openai_provider_refuses_wrong_dimensions_and_unreachable_servers(embeddings_server: str) -> None:
    _Handler.dimensions = 1536
    with pytest.raises(ServiceUnavailable):
        OpenAIEmbedder(url=embeddings_server, api_key="", model="m").embed(["x"])
    with pytest.raises(ServiceUnavailable):
        OpenAIEmbedder(url="http://127.0.0.1:9/v1", api_key="", model="m").embed(["x"])
    with pytest.raises(ServiceUnavailable):
        OpenAIEmbedder(url="", api_key="", model="m")


# --- the real worker path ---------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_new_memories_are_embedded_by_the_worker_after_commit(celery_worker: Any) -> None:
    stack = make_stack(make_org())
    with transaction.atomic():
        memory = note(stack, "embedded by a real worker")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        memory.refresh_from_db()
        if memory.embedded_version is not None:
            break
        time.sleep(0.2)
    assert memory.embedded_version == memory.version
    assert memory.embedding_model == "hash-v1/384"


def large_write(stack: Any) -> list[str]:
    """A write of more memories than coalesce with a stack's waiting message (memories.writes.hooks)."""
    items = [{"kind": "note", "content": f"imported note {n}"} for n in range(SMALL_EMBED_MESSAGE_IDS + 1)]
    return [str(m.pk) for m in memory_batch_create(stack=stack, items=items, source="api")]


@pytest.mark.django_db
def test_a_large_writes_embedding_messages_wait_in_the_broker_compressed(
        django_capture_on_commit_callbacks: Any) -> None:
    """While no worker takes them (the embedding waiting out a flood), these messages are what the
    broker holds: compressed, the same ids in less of its memory."""
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    with django_capture_on_commit_callbacks(execute=True):
        ids = large_write(make_stack(make_org()))

    sent = []  # (compression, ids, bytes as stored, bytes decompressed)
    for raw in cast(list[bytes], broker.lrange(EMBEDDING_QUEUE, 0, -1)):  # the sync client's answer
        message = json.loads(raw)
        stored = base64.b64decode(message["body"])
        body = kombu.compression.decompress(stored, message["headers"].get("compression"))
        message_ids = json.loads(body)[0][0]
        if set(message_ids) <= set(ids):
            sent.append((message["headers"].get("compression"), message_ids, len(stored), len(body)))
            broker.lrem(EMBEDDING_QUEUE, 1, raw.decode())
    assert sorted(i for _, message_ids, _, _ in sent for i in message_ids) == sorted(ids)
    assert {compression for compression, _, _, _ in sent} == {"application/x-gzip"}
    assert sum(stored for _, _, stored, _ in sent) < 0.7 * sum(body for _, _, _, body in sent)


@pytest.mark.django_db(transaction=True)
def test_the_worker_embeds_every_memory_of_a_large_write(celery_worker: Any) -> None:
    """End to end through a real worker: the write's messages are the compressed ones of the test
    above, so a worker that could not read them would leave these memories without a vector."""
    ids = large_write(make_stack(make_org()))
    deadline = time.monotonic() + 60
    while Memory.objects.filter(pk__in=ids, embedded_version__isnull=True).exists():
        assert time.monotonic() < deadline, "the worker did not embed the large write's memories"
        time.sleep(0.2)


@pytest.mark.django_db
def test_readyz_reports_the_embedding_backlog_without_failing_on_it(client: Any) -> None:
    stack = make_stack(make_org())
    note(stack, "awaiting a vector")
    note(stack, "also awaiting")
    body = client.get("/readyz").json()
    assert body["embedding_backlog"] == 2 and body["embedding_backlog_capped"] is False
    assert "embedding_backlog" not in body["failing"]
