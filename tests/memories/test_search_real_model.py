"""Search with the REAL all-MiniLM-L6-v2 model (loaded once per session, a few seconds on CPU).

Few and focused: paraphrases find their memory, other stacks never leak in, a stack with k
matching memories yields k hits at every size from 3 to 50,000, a school-wide scope is ranked
exactly, and a large stack's own HNSW index is walked.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from memories.models import Memory
from memories.search.embedding_jobs import memories_embed
from memories.search.embedding_model import deployment_model_switch
from memories.search.embeddings import get_embedder
from memories.search.hybrid import search_memories
from memories.search.query import SearchQuery
from memories.services import memory_create
from tests.factories import bearer_client, make_key, make_org, make_stack, sql_rows

pytestmark = [pytest.mark.django_db, pytest.mark.slow]  # slow: the real embedding model

FACTS = [
    "Alice understands fractions much better when the teacher cuts a pizza into equal slices.",
    "Alice gets anxious during timed spelling tests and freezes up.",
    "Alice's favourite book series is about a dragon who runs a bakery.",
    "Alice walks her grandmother's dog every afternoon after school.",
    "Alice wants to become a marine biologist and study coral reefs.",
    "Alice struggles to stay focused in the last lesson before lunch.",
    "Alice plays the violin in the school orchestra on Thursdays.",
    "Alice is allergic to peanuts; keep snacks nut-free on trips.",
]

PARAPHRASES = [
    ("What helps this student grasp parts of a whole?", 0),
    ("Does she get nervous when exams are against the clock?", 1),
    ("What kind of novels does she enjoy?", 2),
    ("Who does she look after in the afternoons?", 3),
    ("Which career does she dream about in ocean science?", 4),
    ("Any food intolerances we should know about for excursions?", 7),
    ("Which musical instrument does she play?", 6),
]


@pytest.fixture
def minilm(settings: Any) -> Iterator[Any]:
    settings.EMBEDDING_PROVIDER = "minilm"
    embedder = get_embedder()
    assert embedder.model_id == "all-MiniLM-L6-v2-int8/384"  # the default runtime: ONNX int8 (§10.1)
    deployment_model_switch(embedder.model_id)  # this test's deployment embeds with MiniLM (docs/algorithms.md §10.3)
    yield embedder


def add_facts(stack: Any, facts: list[str]) -> list[Memory]:
    memories = [memory_create(stack=stack, kind="note", payload={"content": f}, source="api") for f in facts]
    assert memories_embed(ids=[m.pk for m in memories]).embedded == len(facts)
    return memories


def test_paraphrased_queries_find_their_memory(minilm: Any) -> None:
    stack = make_stack(make_org(), "alice")
    memories = add_facts(stack, FACTS)
    for question, expected in PARAPHRASES:
        hits = search_memories(stack_ids=[stack.pk], query=SearchQuery(text=question, limit=3)).hits
        assert hits, question
        assert hits[0].memory.pk == memories[expected].pk, (question, [h.memory.text for h in hits])
        # Found by meaning: the vector leg ranks it first. Not an absolute cosine floor: the int8
        # graph's cosines move with the CPU's integer kernels (docs/algorithms.md §10.1) - 0.297 on
        # an AVX2-only machine for a pair above 0.3 with AVX-512 - while the order holds.
        assert hits[0].semantic_rank == 0, (question, hits[0].semantic_score)


def test_nonsense_query_returns_an_empty_200_and_other_stacks_never_appear(minilm: Any) -> None:
    org = make_org()
    alice, bob = make_stack(org, "alice"), make_stack(org, "bob")
    add_facts(alice, FACTS[:4])
    bob_secret = add_facts(bob, ["Bob understands fractions much better when the teacher cuts a pizza into slices."])
    _, secret = make_key(org, stack=alice)
    client = bearer_client(secret)
    body = client.post("/memories/search", {"query": "zxqv plorbt wug"}, format="json")
    assert body.status_code == 200
    assert body.json()["results"] == []
    # The best match in the whole table lives in bob's stack: alice's search must not return it.
    for url, payload in (("/memories/search", {"query": "pizza fractions", "memory_types": ["notes"]}),
                         ("/api/v1/stacks/alice/search", {"query": "pizza fractions", "limit": 100,
                                                          "min_similarity": 0})):
        results = client.post(url, payload, format="json").json()["results"]
        assert results
        assert bob_secret[0].record_id not in {r["id"] for r in results}
        assert str(bob_secret[0].pk) not in {r["id"] for r in results}


def _insert_random(stack: Any, size: int, model_id: str) -> None:
    """`size` memories with random vectors labelled as the current model, in one set-based INSERT."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO memories_memory (id, stack_id, kind, record_id, text, data, extra, tags, confidence,
                source_type, source_entity, derived_from, source_episodes, emotional_valence, emotional_arousal,
                emotional_tags, subject_ids, access_grants, consent_grants, strength, times_accessed, is_protected,
                stability, difficulty, forgotten_reason, version, created_at, server_updated_at, embedding,
                embedding_model, embedded_version, size_bytes)
            SELECT gen_random_uuid(), %(stack)s, 'note', 'r' || g, 'synthetic memory number ' || g,
                   jsonb_build_object('content', 'synthetic memory number ' || g), '{}', '{}', 0.8,
                   '', '', '{}', '{}', 0, 0, '{}', '{}', '{}', '{}', 1.0, 0, false, 1.0, 5.0, '', 1, now(), now(),
                   (SELECT array_agg(random() - 0.5 + 0 * d) FROM generate_series(1, 384) AS d WHERE g > 0)::vector,
                   %(model)s, 1, 40
              FROM generate_series(1, %(size)s) AS g
            """,
            {"stack": stack.pk, "model": model_id, "size": size},
        )


def _populate(org: Any, sizes: dict[str, int], model_id: str) -> dict[str, Any]:
    stacks = {slug: make_stack(org, slug) for slug in sizes}
    with connection.cursor() as cursor:
        # Inside the test's transaction, Django's deferred FK checks would block a CREATE INDEX later.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    for slug, size in sizes.items():
        _insert_random(stacks[slug], size, model_id)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE memories_memory")
    return stacks


QUESTION = "how does the student learn fractions"


@pytest.mark.parametrize("size", [3, 2_000, 50_000])
def test_k_hits_whenever_k_exist_from_3_to_50000(minilm: Any, size: int) -> None:
    """A stack without its own vector index is ranked exactly at any size (a 50,000-row stack waits
    for the periodic job to build its index; the last test here walks one)."""
    stacks = _populate(make_org(), {"crowd": 20_000 if size == 50_000 else 5_000, "target": size}, minilm.model_id)
    _assert_k_hits(stacks["target"], size, walked=False)


def test_a_school_wide_search_ranks_every_stack_exactly(minilm: Any) -> None:
    """Several stacks of a school (school keys' search) are one scope ranked exactly: the vector
    leg's nearest are exactly the nearest of those stacks' rows, and another school's never appear."""
    from memories.search.query import SCORE, over_fetch
    from memories.search.vector_leg import vector_leg, vector_sql

    stacks = _populate(make_org(), {"a": 3_000, "b": 3_000, "c": 3_000}, minilm.model_id)
    outsider = _populate(make_org(), {"other": 3_000}, minilm.model_id)["other"]
    scope = [stacks["a"].pk, stacks["b"].pk]
    query = SearchQuery(text=QUESTION, limit=10, min_similarity=0.0)
    vector = minilm.embed([query.text])[0]
    rows, method = vector_leg(query, scope, vector, over_fetch(10), {})
    assert method == "exact"
    nearest = {row[0] for row in sorted(rows, key=lambda r: -float(r[SCORE]))[:10]}
    sql, params = vector_sql(query, [*scope, stacks["c"].pk, outsider.pk], vector, 100, exact=True)
    ranked = [row.id for row in sql_rows(sql, params)]
    in_scope = set(Memory.objects.filter(stack_id__in=scope).values_list("pk", flat=True))
    assert nearest == set([memory_id for memory_id in ranked if memory_id in in_scope][:10])
    result = search_memories(stack_ids=scope, query=SearchQuery(text=QUESTION, limit=20, min_similarity=0.0))
    assert result.method == "exact" and len(result.hits) == 20
    assert {hit.memory.stack_id for hit in result.hits} <= set(scope)


def _assert_k_hits(stack: Any, size: int, *, walked: bool) -> None:
    """k hits for k in 1, 10, 100; `walked`: through the stack's own HNSW index, else exactly."""
    seen: set[str] = set()
    for k in (1, 10, 100):
        result = search_memories(stack_ids=[stack.pk],
                                 query=SearchQuery(text=QUESTION, limit=k, min_similarity=0.0))
        assert len(result.hits) == min(k, size), (k, result.method, result.stats)
        assert {hit.memory.stack_id for hit in result.hits} == {stack.pk}
        # The vector leg alone produced k rows (its over-fetch), whatever the keyword leg found.
        assert result.stats["semantic_candidates"] >= min(k, size)
        seen.add(result.method)
    if walked:
        # The walk serves at least the small k; a k too big for its width is ranked exactly.
        assert "hnsw-stack" in seen and seen <= {"hnsw-stack", "hnsw-stack+exact"}, seen
    else:
        assert seen == {"exact"}, seen


def test_large_stack_with_its_own_partial_index_gets_full_recall(minilm: Any) -> None:
    """A stack with its own partial HNSW index is walked alone: k hits, matching an exact ranking."""
    from memories.search.query import SCORE, over_fetch
    from memories.search.vector_indexes import stack_vector_index_ensure, stacks_with_vector_index
    from memories.search.vector_leg import vector_leg, vector_sql

    stacks = _populate(make_org(), {"crowd": 6_000, "target": 1_500}, minilm.model_id)
    target = stacks["target"]
    assert stack_vector_index_ensure(stack_id=target.pk, concurrently=False) is True
    assert stack_vector_index_ensure(stack_id=target.pk, concurrently=False) is False  # idempotent
    assert target.pk in stacks_with_vector_index()
    _assert_k_hits(target, 1_500, walked=True)
    query = SearchQuery(text=QUESTION, limit=10, min_similarity=0.0)
    vector = minilm.embed([query.text])[0]
    rows, method = vector_leg(query, [target.pk], vector, over_fetch(10), {})
    assert method == "hnsw-stack"
    sql, params = vector_sql(query, [target.pk], vector, 10, exact=True)
    truth = {row.id for row in sql_rows(sql, params)}
    # The leg's rows are the search's own tuples: id first, then its columns up to the score.
    top = {row[0] for row in sorted(rows, key=lambda r: -float(r[SCORE]))[:10]}
    # Uniform random 384-d vectors are the hardest case for HNSW; bench/search.py measures realistic ones.
    assert len(top & truth) >= 8


def test_a_single_query_embeds_exactly_as_in_a_batch(minilm: Any) -> None:
    """The one-text fast path (used for every search query) must give the vectors stored rows got
    from batched `encode`, or queries would drift from the memories they should find."""
    texts = ["how does this student learn fractions?", "x" * 3000, "Émilie a peint un lever de soleil."]
    batched = minilm.embed(texts)
    for text, expected in zip(texts, batched, strict=True):
        (single,) = minilm.embed([text])
        assert len(single) == 384
        assert max(abs(a - b) for a, b in zip(single, expected, strict=True)) < 1e-5


def test_queries_take_the_traced_single_text_path_and_fall_back_to_eager_when_tracing_fails(
        minilm: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import torch

    from memories.search.embeddings import MiniLMEmbedder

    text = "how does this student learn fractions?"
    torch_runtime = MiniLMEmbedder(runtime="torch")  # the trace is the torch runtime's query path
    (expected,) = torch_runtime.embed([text, "a second text so the batched path runs"])[:1]
    assert torch_runtime._single is not None  # the loaded model traced its one-text encoder

    def broken_trace(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("tracing unsupported here")

    monkeypatch.setattr(torch.jit, "trace", broken_trace)
    eager_only = MiniLMEmbedder(runtime="torch")
    (single,) = eager_only.embed([text])
    assert eager_only._single is None
    assert "single-text trace unavailable" in caplog.text
    assert max(abs(a - b) for a, b in zip(single, expected, strict=True)) < 1e-5
