"""One embedding model per deployment (docs/algorithms.md §10.3).

* a `manage.py reembed` from a shell set for another model refuses in one line and changes nothing;
  `--switch-model` is the deliberate switch, and then the service's own model is the one refused;
* a stored vector of another model is re-embedded by the periodic sweep, which stops looking once
  none is left;
* every search response says which legs ran, and why the semantic one did not.

The second model is an OpenAI-compatible endpoint served on 127.0.0.1 by the test itself: a real
provider, deterministic, and no 90 MB model load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext

from memories.models import DeploymentEmbeddingModel, JobRun, Memory
from memories.search.embedding_backlog import embedding_sweep, embedding_sweep_run
from memories.search.embedding_jobs import memories_embed
from memories.search.embedding_model import deployment_model_id
from memories.search.embedding_store import store_vectors
from memories.search.embeddings import _embedder_for, query_cache
from memories.search.hybrid import search_memories
from memories.search.query import SearchQuery
from memories.search.smart_ingest import smart_ingest
from memories.services import memory_create
from stacks.models import Stack
from tests.factories import bearer_client, make_key, make_org, make_stack

pytestmark = pytest.mark.slow  # the real model and manage.py processes

BASE_DIR = Path(__file__).resolve().parents[2]
HASH = "hash-v1/384"
MINILM = "all-MiniLM-L6-v2-int8/384"  # the default minilm runtime, ONNX int8 (docs/algorithms.md §10.1)
REMOTE = "remote-embedder/384"  # what the local OpenAI-compatible endpoint below embeds with


class _Embeddings(BaseHTTPRequestHandler):
    """`POST /v1/embeddings`: a unit vector per input, its direction taken from the text's length."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        data = [{"index": i, "embedding": [0.0] * (len(text) % 384) + [1.0] + [0.0] * (383 - len(text) % 384)}
                for i, text in enumerate(body["input"])]
        payload = json.dumps({"data": data, "model": body["model"]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def remote_embedder() -> Iterator[dict[str, str]]:
    """The environment that makes a process embed with REMOTE, against a server on 127.0.0.1."""
    server = HTTPServer(("127.0.0.1", 0), _Embeddings)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield {"EMBEDDING_PROVIDER": "openai", "EMBEDDING_API_URL": f"http://127.0.0.1:{server.server_address[1]}/v1",
           "EMBEDDING_MODEL": REMOTE.split("/")[0]}
    server.shutdown()


@pytest.fixture(autouse=True)
def _fresh_embedders() -> Iterator[None]:
    """Embedders are cached per process and provider; these tests change the provider's settings."""
    _embedder_for.cache_clear()
    query_cache.clear()
    yield
    _embedder_for.cache_clear()
    query_cache.clear()


def use_provider(settings: Any, env: dict[str, str]) -> None:
    for name, value in env.items():
        setattr(settings, name, value)
    _embedder_for.cache_clear()


def note(stack: Stack, content: str) -> Memory:
    return memory_create(stack=stack, kind="note", payload={"content": content}, source="api")


def manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`manage.py …` in a fresh process against the test database, as an operator's second shell."""
    db = settings.DATABASES["default"]
    base = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDDING_")}
    base["DATABASE_URL"] = f"postgresql://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    return subprocess.run([sys.executable, "manage.py", *args], cwd=BASE_DIR, env={**base, **env},
                          capture_output=True, text=True, timeout=120)


def embed_all(memories: list[Memory]) -> None:
    memories_embed(ids=[m.pk for m in memories])
    assert not Memory.objects.filter(embedded_version__isnull=True).exists()


def vector_state() -> list[tuple[Any, ...]]:
    return sorted((str(m.pk), m.embedding_model, m.embedded_version, [round(x, 6) for x in m.embedding])
                  for m in Memory.objects.all())


# --- reembed from another shell ------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_reembed_from_a_shell_set_for_another_model_refuses_and_changes_nothing(
        remote_embedder: dict[str, str]) -> None:
    stack = make_stack(make_org())
    memories = [note(stack, f"alice learns fractions {i}") for i in range(4)]
    embed_all(memories)  # the deployment: hash-v1
    assert deployment_model_id() == HASH
    before = vector_state()

    # The mismatched shell, the other way round: no EMBEDDING_PROVIDER set, so the settings'
    # default (MiniLM, as for the service under `make run`) against a deployment of hash vectors.
    for args, env in ((("reembed",), {}), (("reembed", "--all"), {}), (("reembed", "--queue"), remote_embedder)):
        result = manage(*args, **env)
        assert result.returncode == 1, result.stdout + result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        configured = REMOTE if env else MINILM
        assert f"refusing to embed: this process embeds with {configured}" in lines[0]
        assert f"the deployment's vectors are {HASH}" in lines[0]
        assert "EMBEDDING_PROVIDER=hash" in lines[0] and "reembed --switch-model" in lines[0]
        assert vector_state() == before
        assert deployment_model_id() == HASH

    # The deployment's own model re-embeds as before.
    ok = manage("reembed", "--all", EMBEDDING_PROVIDER="hash")
    assert ok.returncode == 0, ok.stderr
    assert "4 marked for re-embedding" in ok.stdout and "0 awaiting" in ok.stdout


@pytest.mark.django_db(transaction=True)
def test_switch_model_reembeds_everything_records_the_model_and_then_refuses_the_old_one(
        remote_embedder: dict[str, str], settings: Any) -> None:
    stack = make_stack(make_org())
    memories = [note(stack, f"pizza fractions lesson number {i}") for i in range(5)]
    embed_all(memories)

    switched = manage("reembed", "--switch-model", **remote_embedder)
    assert switched.returncode == 0, switched.stderr
    assert f"deployment embedding model: {HASH} -> {REMOTE}" in switched.stdout
    assert "5 marked for re-embedding" in switched.stdout and "0 awaiting" in switched.stdout
    assert set(Memory.objects.values_list("embedding_model", flat=True)) == {REMOTE}
    assert DeploymentEmbeddingModel.objects.get().model_id == REMOTE

    # This process (the "service") still says hash: it writes no vector, its sweep's run fails
    # saying why, and its searches skip the semantic leg instead of comparing two models.
    fresh = note(stack, "written after the switch")
    assert memories_embed(ids=[fresh.pk]).refused == 1
    assert Memory.objects.get(pk=fresh.pk).embedded_version is None
    run = embedding_sweep_run()
    assert run.status == JobRun.Status.FAILED and "reembed --switch-model" in run.error
    with pytest.raises(CommandError, match=f"the deployment's vectors are {REMOTE}"):
        call_command("runjob", "embedding-sweep", "--no-progress")
    result = search_memories(stack_ids=[stack.pk], query=SearchQuery(text="pizza fractions"))
    assert result.legs == {"keyword": "ran", "semantic": f"skipped: model mismatch (queries are embedded with "
                                                         f"{HASH}, the stored vectors with {REMOTE})"}
    # The five matching notes (a neighbouring turn may join them on context: docs/algorithms.md §7.5).
    assert {m.pk for m in memories} <= {hit.memory.pk for hit in result.hits}
    assert all(hit.semantic_score is None for hit in result.hits)

    # Restarted with the deployment's setting, it embeds what was written meanwhile.
    use_provider(settings, remote_embedder)
    assert embedding_sweep().embedded == 1
    assert search_memories(stack_ids=[stack.pk], query=SearchQuery(text="pizza fractions", min_similarity=0)
                           ).legs == {"keyword": "ran", "semantic": "ran"}


# --- the sweep heals other models' vectors -------------------------------------------------------------

@pytest.mark.django_db
def test_the_sweep_reembeds_vectors_of_another_model_then_stops_looking() -> None:
    stack = make_stack(make_org())
    memories = [note(stack, f"the museum trip, part {i}") for i in range(6)]
    memories_embed(ids=[m.pk for m in memories])
    # The state a mismatched shell used to leave behind: some vectors of another model, no record of the deployment's
    # (written before it existed, as by a `reembed` from a second shell).
    stray = [m.pk for m in memories[:3]]
    Memory.objects.filter(pk__in=stray).update(embedding_model=MINILM)
    DeploymentEmbeddingModel.objects.all().delete()
    result = search_memories(stack_ids=[stack.pk], query=SearchQuery(text="museum trip", min_similarity=0))
    assert result.legs["semantic"] == "ran"  # the hash rows still answer; the stray ones are not compared
    assert {str(h.memory.pk) for h in result.hits if h.semantic_score is not None} == {
        str(m.pk) for m in memories[3:]}

    first = embedding_sweep()
    assert (first.embedded, first.other_model) == (3, 3)
    assert set(Memory.objects.values_list("embedding_model", flat=True)) == {HASH}
    assert all(m.embedded_version == m.version for m in Memory.objects.all())
    record = DeploymentEmbeddingModel.objects.get()
    assert record.model_id == HASH and record.verified_at is None  # found some: looks once more

    second = embedding_sweep()
    assert (second.embedded, second.other_model) == (0, 0)
    assert DeploymentEmbeddingModel.objects.get().verified_at is not None

    # Verified: the steady-state sweep no longer looks for other models (no table scan each minute).
    with CaptureQueriesContext(connection) as queries:
        embedding_sweep()
    assert not any("embedding_model" in q["sql"] for q in queries.captured_queries), queries.captured_queries


@pytest.mark.django_db
def test_no_writer_stores_a_vector_of_another_model(settings: Any, remote_embedder: dict[str, str]) -> None:
    stack = make_stack(make_org())
    memory = note(stack, "alice prefers visual explanations")
    memories_embed(ids=[memory.pk])
    memory.refresh_from_db()
    # The one function that writes vectors checks the deployment's model in the same statement.
    assert store_vectors([(str(memory.pk), memory.version)], [[1.0] + [0.0] * 383], REMOTE) == 0
    assert Memory.objects.get(pk=memory.pk).embedding_model == HASH

    use_provider(settings, remote_embedder)
    decision = smart_ingest(stack=stack, kind="note", payload={"content": "alice prefers visual explanations"})
    assert decision.decision == "create" and decision.measure == "none"
    assert "similarity not measured" in decision.reason and HASH in decision.reason
    assert Memory.objects.get(pk=decision.memory.pk).embedded_version is None  # left for the deployment's model


# --- search says which legs ran --------------------------------------------------------------------------

@pytest.mark.django_db
def test_search_responses_say_which_legs_ran(settings: Any, remote_embedder: dict[str, str]) -> None:
    org = make_org()
    stack = make_stack(org, "alice")
    _, secret = make_key(org, stack=stack)
    school_key = make_key(org)[1]
    client, school = bearer_client(secret), bearer_client(school_key)

    def legs() -> list[dict[str, str]]:
        bodies = [client.post("/api/v1/stacks/alice/search", {"query": "fractions"}, format="json"),
                  school.post("/api/v1/search", {"query": "fractions"}, format="json"),
                  client.post("/memories/search", {"query": "fractions"}, format="json")]
        assert [b.status_code for b in bodies] == [200, 200, 200], [b.content for b in bodies]
        assert all(b.json()["total"] == 1 for b in bodies)  # the keyword leg answers in every case
        return [b.json()["legs"] for b in bodies]

    memory = note(stack, "alice learns fractions with pizza")
    assert legs() == [{"keyword": "ran", "semantic": "skipped: no embedded memories yet"}] * 3

    memories_embed(ids=[memory.pk])
    assert legs() == [{"keyword": "ran", "semantic": "ran"}] * 3

    use_provider(settings, remote_embedder)  # this process now queries with another model
    mismatch = f"skipped: model mismatch (queries are embedded with {REMOTE}, the stored vectors with {HASH})"
    assert legs() == [{"keyword": "ran", "semantic": mismatch}] * 3


@pytest.mark.django_db
def test_an_unreachable_embedder_leaves_keyword_results_and_says_so(settings: Any) -> None:
    DeploymentEmbeddingModel.objects.all().delete()  # nothing embedded yet: no deployment model either
    stack = make_stack(make_org())
    note(stack, "alice learns fractions with pizza")
    use_provider(settings, {"EMBEDDING_PROVIDER": "openai", "EMBEDDING_API_URL": "http://127.0.0.1:9/v1",
                            "EMBEDDING_MODEL": "unreachable"})
    result = search_memories(stack_ids=[stack.pk], query=SearchQuery(text="fractions"))
    assert result.legs == {"keyword": "ran", "semantic": "skipped: embedder unavailable"}
    assert len(result.hits) == 1 and result.method == "none"
    use_provider(settings, {"EMBEDDING_API_URL": ""})  # not configured at all: the same answer
    result = search_memories(stack_ids=[stack.pk], query=SearchQuery(text="fractions"))
    assert result.legs["semantic"] == "skipped: embedder unavailable" and len(result.hits) == 1
