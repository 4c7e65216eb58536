"""Hybrid search with the deterministic hash embedder: ranking, filters, scores, routes, isolation."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import Membership
from memories.models import Memory
from memories.search.embedding_jobs import memories_embed
from memories.search.fusion import RRF_K, ranking_weight
from memories.search.hybrid import search_memories
from memories.search.query import SearchQuery
from memories.services import memory_create, memory_forget
from stacks.models import Stack
from tests.factories import (
    assign_teacher,
    bearer_client,
    index_definitions,
    make_key,
    make_org,
    make_stack,
    make_user,
)

pytestmark = pytest.mark.django_db


def add(stack: Stack, content: str, *, kind: str = "note", embed: bool = True, **fields: Any) -> Memory:
    payloads = {"note": {"content": content}, "belief": {"statement": content},
                "episode": {"objective": content, "outcome": "done"}}
    memory = memory_create(stack=stack, kind=kind, payload={**payloads[kind], **fields}, source="api")
    if embed:
        memories_embed(ids=[memory.pk])
    return memory


def session_client(user: Any) -> APIClient:
    """A logged-in dashboard session (CSRF is the dashboard's concern, tested with it)."""
    client = APIClient()
    client.force_login(user)
    return client


def ids(hits: list[Any]) -> list[str]:
    return [str(hit.memory.pk) for hit in hits]


@pytest.fixture
def school() -> dict[str, Any]:
    org = make_org()
    stack = make_stack(org, "alice")
    other = make_stack(org, "bob")
    return {"org": org, "stack": stack, "other": other}


def test_finds_the_matching_memory_with_both_legs_and_scores_in_range(school: dict[str, Any]) -> None:
    stack = school["stack"]
    target = add(stack, "Alice learns fractions best with pizza slices")
    add(stack, "Alice enjoys football on Saturdays")
    add(stack, "The class visited the science museum")
    result = search_memories(stack_ids=[stack.pk], query=SearchQuery(text="fractions pizza"))
    assert ids(result.hits)[0] == str(target.pk)
    top = result.hits[0]
    assert top.match_type == "both"
    assert top.keyword_score == 1.0
    assert top.semantic_score is not None and 0.0 < top.semantic_score <= 1.0
    assert 0.0 < top.combined_score <= 1.0
    # Both legs ranked it first: rrf = 2/60, so combined is exactly the ranking weight.
    assert top.fused_score == pytest.approx(2 / RRF_K)
    assert top.combined_score == pytest.approx(top.weight, abs=1e-6)
    assert result.method == "exact"


def test_ranking_weight_prefers_retained_confident_recent_memories() -> None:
    assert ranking_weight(retention=1.0, confidence=1.0, age_days=0) == pytest.approx(1.0)
    assert ranking_weight(retention=0.2, confidence=1.0, age_days=0) < ranking_weight(retention=0.9, confidence=1.0,
                                                                                        age_days=0)
    assert ranking_weight(retention=1.0, confidence=0.1, age_days=0) < ranking_weight(retention=1.0, confidence=0.9,
                                                                                        age_days=0)
    assert ranking_weight(retention=1.0, confidence=1.0, age_days=30) == pytest.approx(0.85 + 0.15 * 0.95 ** 30)
    # Age beyond 30 days costs nothing more (recency is capped).
    assert ranking_weight(retention=1.0, confidence=1.0, age_days=400) == ranking_weight(
        retention=1.0, confidence=1.0, age_days=30)


def test_low_confidence_copy_ranks_below_confident_one(school: dict[str, Any]) -> None:
    stack = school["stack"]
    weak = add(stack, "photosynthesis needs sunlight and water", confidence=0.1)
    strong = add(stack, "photosynthesis needs sunlight and water", confidence=1.0, record_id=None)
    result = search_memories(stack_ids=[stack.pk], query=SearchQuery(text="photosynthesis sunlight"))
    assert ids(result.hits)[:2] == [str(strong.pk), str(weak.pk)]


def test_filters_kind_tags_and_time_range(school: dict[str, Any]) -> None:
    stack = school["stack"]
    note = add(stack, "volcano project notes", tags=["science"])
    belief = add(stack, "volcano eruptions are predictable", kind="belief", tags=["geo"])
    old = add(stack, "volcano trip long ago", tags=["science"])
    Memory.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=400))

    def found(**kwargs: Any) -> set[str]:
        query = SearchQuery(text="volcano", min_similarity=0.0, **kwargs)
        return set(ids(search_memories(stack_ids=[stack.pk], query=query).hits))

    assert found() == {str(note.pk), str(belief.pk), str(old.pk)}
    assert found(kinds=("belief",)) == {str(belief.pk)}
    assert found(tags=("science",)) == {str(note.pk), str(old.pk)}
    assert found(created_after=timezone.now() - timedelta(days=30)) == {str(note.pk), str(belief.pk)}
    assert found(created_before=timezone.now() - timedelta(days=30)) == {str(old.pk)}


def test_forgotten_deleted_and_expired_memories_never_appear(school: dict[str, Any]) -> None:
    stack = school["stack"]
    live = add(stack, "the tortoise sleeps all winter")
    forgotten = add(stack, "the tortoise eats lettuce")
    deleted = add(stack, "the tortoise is called Sheldon")
    expired = add(stack, "the tortoise has a vet appointment")
    now = timezone.now()
    Memory.objects.filter(pk=forgotten.pk).update(forgotten_at=now, forgotten_reason="manual")
    Memory.objects.filter(pk=deleted.pk).update(deleted_at=now)
    Memory.objects.filter(pk=expired.pk).update(expires_at=now - timedelta(minutes=1))
    result = search_memories(stack_ids=[stack.pk], query=SearchQuery(text="tortoise", min_similarity=0.0))
    assert ids(result.hits) == [str(live.pk)]


def test_min_similarity_applies_only_to_the_semantic_leg(school: dict[str, Any]) -> None:
    stack = school["stack"]
    keyword_only = add(stack, "xylophone", embed=False)  # no vector yet: keyword leg only
    result = search_memories(stack_ids=[stack.pk], query=SearchQuery(text="xylophone", min_similarity=1.0))
    assert ids(result.hits) == [str(keyword_only.pk)]
    assert result.hits[0].match_type == "keyword"
    assert result.hits[0].semantic_score is None


@pytest.mark.parametrize("size", [3, 40, 400])
def test_k_hits_whenever_k_exist(school: dict[str, Any], size: int) -> None:
    stack = school["stack"]
    for i in range(size):
        add(stack, f"memory number {i} about topic {i % 7}", embed=False)
    memories_embed(ids=Memory.objects.filter(stack=stack).values_list("pk", flat=True))
    add(school["other"], "memory number 1 about topic 1")
    for k in (1, 3, 10, 100):
        hits = search_memories(stack_ids=[stack.pk],
                               query=SearchQuery(text="completely unrelated words", limit=k, min_similarity=0.0)).hits
        assert len(hits) == min(k, size)
        assert {h.memory.stack_id for h in hits} == {stack.pk}


def test_other_stacks_never_appear(school: dict[str, Any]) -> None:
    add(school["other"], "secret about bob and his fractions homework")
    mine = add(school["stack"], "alice fractions homework")
    hits = search_memories(stack_ids=[school["stack"].pk],
                           query=SearchQuery(text="bob secret fractions homework", min_similarity=0.0)).hits
    assert ids(hits) == [str(mine.pk)]


# --- routes -------------------------------------------------------------------------------------------

def test_native_search_route_returns_scores(school: dict[str, Any]) -> None:
    target = add(school["stack"], "Alice prefers visual explanations of fractions", tags=["maths"])
    _, secret = make_key(school["org"], stack=school["stack"])
    response = bearer_client(secret).post("/api/v1/stacks/alice/search",
                                          {"query": "visual fractions", "limit": 500}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["total"] == 1
    hit = body["results"][0]
    assert hit["id"] == str(target.pk)
    assert hit["stack"] == "alice"
    assert hit["match_type"] == "both"
    for name in ("score", "combined_score", "keyword_score", "semantic_score"):
        assert 0.0 <= hit[name] <= 1.0
    assert body["method"] == "exact"


@pytest.mark.parametrize("body, field", [
    ({}, "query"), ({"query": "   "}, "query"), ({"query": 5}, "query"), ({"query": "x" * 3000}, "query"),
    ({"query": "a", "limit": "many"}, "limit"), ({"query": "a", "kinds": ["dragons"]}, "kinds"),
    ({"query": "a", "kinds": "note"}, "kinds"), ({"query": "a", "tags": [1]}, "tags"),
    ({"query": "a", "created_after": "yesterday-ish"}, "created_after"),
    ({"query": "a", "min_similarity": "high"}, "min_similarity"),
])
def test_native_search_rejects_bad_input_with_field_errors(school: dict[str, Any], body: dict[str, Any],
                                                           field: str) -> None:
    _, secret = make_key(school["org"], stack=school["stack"])
    response = bearer_client(secret).post("/api/v1/stacks/alice/search", body, format="json")
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]


def test_native_search_non_object_body_is_400(school: dict[str, Any]) -> None:
    _, secret = make_key(school["org"], stack=school["stack"])
    response = bearer_client(secret).post("/api/v1/stacks/alice/search", ["query"], format="json")
    assert response.status_code == 400


def test_native_search_isolation(school: dict[str, Any]) -> None:
    add(school["stack"], "alice private fractions notes")
    _, bound_to_other = make_key(school["org"], stack=school["other"])
    _, other_school = make_key(make_org())
    teacher = make_user(school["org"], role=Membership.Role.TEACHER)
    assign_teacher(teacher, school["other"])
    for client in (bearer_client(bound_to_other), bearer_client(other_school), session_client(teacher)):
        response = client.post("/api/v1/stacks/alice/search", {"query": "fractions"}, format="json")
        assert response.status_code == 404
        assert "fractions" not in response.content.decode()
    # The assigned teacher and a read-only key may search (reading is allowed).
    assign_teacher(teacher, school["stack"])
    assert session_client(teacher).post("/api/v1/stacks/alice/search", {"query": "fractions"},
                                        format="json").json()["total"] == 1
    _, read_only = make_key(school["org"], stack=school["stack"], read_only=True)
    assert bearer_client(read_only).post("/api/v1/stacks/alice/search", {"query": "fractions"},
                                         format="json").json()["total"] == 1


def test_unauthenticated_search_is_401(school: dict[str, Any]) -> None:
    from rest_framework.test import APIClient

    assert APIClient().post("/api/v1/stacks/alice/search", {"query": "x"}, format="json").status_code == 401
    assert APIClient().post("/memories/search", {"query": "x"}, format="json").status_code == 401


def test_school_key_searches_across_its_stacks_and_nothing_else_can(school: dict[str, Any]) -> None:
    a = add(school["stack"], "volcano report by alice")
    b = add(school["other"], "volcano drawing by bob")
    foreign = make_stack(make_org(), "alice")
    add(foreign, "volcano in another school")
    _, school_key = make_key(school["org"])
    response = bearer_client(school_key).post("/api/v1/search", {"query": "volcano"}, format="json")
    assert response.status_code == 200
    assert {hit["id"] for hit in response.json()["results"]} == {str(a.pk), str(b.pk)}
    only_bob = bearer_client(school_key).post("/api/v1/search", {"query": "volcano", "stacks": ["bob"]},
                                               format="json").json()
    assert [hit["id"] for hit in only_bob["results"]] == [str(b.pk)]
    assert bearer_client(school_key).post("/api/v1/search", {"query": "volcano", "stacks": ["nope"]},
                                          format="json").status_code == 404
    _, agent_key = make_key(school["org"], stack=school["stack"])
    admin = make_user(school["org"], role=Membership.Role.ADMIN)
    for client in (bearer_client(agent_key), session_client(admin)):
        assert client.post("/api/v1/search", {"query": "volcano"}, format="json").status_code == 403


# --- kernle /memories/search --------------------------------------------------------------------------

def test_kernle_search_shape_and_bound_stack(school: dict[str, Any]) -> None:
    episode = add(school["stack"], "Deployed the fractions game", kind="episode",
                  lessons=["Run migrations first"], tags=["deploy"], outcome_type="success")
    add(school["stack"], "deploy notes for fractions game")
    add(school["other"], "Deployed bob's thing")
    _, secret = make_key(school["org"], stack=school["stack"])
    response = bearer_client(secret).post(
        "/memories/search", {"query": "deployed fractions", "limit": 10, "memory_types": ["episodes"]}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["query"] == "deployed fractions"
    assert body["total"] == 1
    hit = body["results"][0]
    assert hit["id"] == episode.record_id
    assert hit["memory_type"] == "episodes"
    assert hit["content"] == "Deployed the fractions game"
    assert 0.0 < hit["score"] <= 1.0
    assert hit["metadata"]["lessons_learned"] == ["Run migrations first"]
    assert hit["metadata"]["outcome_type"] == "success"
    assert hit["metadata"]["tags"] == ["deploy"]


def test_kernle_search_nonsense_query_is_empty_200(school: dict[str, Any]) -> None:
    add(school["stack"], "fractions with pizza")
    _, secret = make_key(school["org"], stack=school["stack"])
    response = bearer_client(secret).post("/memories/search", {"query": "qzxv wplk"}, format="json")
    assert response.status_code == 200
    assert response.json() == {"results": [], "query": "qzxv wplk", "total": 0,
                               "legs": {"keyword": "ran", "semantic": "ran"}}


def test_kernle_search_stack_resolution_order(school: dict[str, Any]) -> None:
    a = add(school["stack"], "alpha fact about fractions")
    b = add(school["other"], "beta fact about fractions")
    _, school_key = make_key(school["org"])
    client = bearer_client(school_key)
    # Nothing pushed yet and no binding: 404, so the client falls back to its local search.
    response = client.post("/memories/search", {"query": "fractions"}, format="json")
    assert response.status_code == 404
    assert response.json()["detail"] == "No stack to search"
    # The most recently pushed stack.
    Stack.objects.filter(pk=school["stack"].pk).update(last_sync_at=timezone.now() - timedelta(hours=1))
    Stack.objects.filter(pk=school["other"].pk).update(last_sync_at=timezone.now())
    assert [r["id"] for r in client.post("/memories/search", {"query": "fractions"},
                                         format="json").json()["results"]] == [b.record_id]
    # An explicit stack_id wins.
    assert [r["id"] for r in client.post("/memories/search", {"query": "fractions", "stack_id": "alice"},
                                         format="json").json()["results"]] == [a.record_id]
    # A bound key searches its stack even though another was pushed later.
    _, bound = make_key(school["org"], stack=school["stack"])
    assert [r["id"] for r in bearer_client(bound).post("/memories/search", {"query": "fractions"},
                                                        format="json").json()["results"]] == [a.record_id]


def test_kernle_search_isolation(school: dict[str, Any]) -> None:
    add(school["stack"], "alice fractions secret")
    _, bound_other = make_key(school["org"], stack=school["other"])
    _, foreign = make_key(make_org())
    for secret in (bound_other, foreign):
        response = bearer_client(secret).post("/memories/search", {"query": "fractions", "stack_id": "alice"},
                                              format="json")
        assert response.status_code == 404
        assert "secret" not in response.content.decode()
    # Bound to bob, no stack_id: searches bob's (empty) stack, never alice's.
    response = bearer_client(bound_other).post("/memories/search", {"query": "fractions"}, format="json")
    assert response.json()["total"] == 0


@pytest.mark.parametrize("body", [
    {}, {"query": ""}, {"query": None}, {"query": "a", "memory_types": "episodes"},
    {"query": "a", "memory_types": ["spaceships"]}, {"query": "a", "limit": {"x": 1}}, {"query": "a", "stack_id": 7},
])
def test_kernle_search_bad_input_is_400(school: dict[str, Any], body: dict[str, Any]) -> None:
    _, secret = make_key(school["org"], stack=school["stack"])
    assert bearer_client(secret).post("/memories/search", body, format="json").status_code == 400


def test_kernle_search_limit_is_clamped(school: dict[str, Any]) -> None:
    for i in range(3):
        add(school["stack"], f"fractions fact {i}")
    _, secret = make_key(school["org"], stack=school["stack"])
    client = bearer_client(secret)
    assert client.post("/memories/search", {"query": "fractions", "limit": -5}, format="json").json()["total"] == 1
    assert client.post("/memories/search", {"query": "fractions", "limit": 1000}, format="json").json()["total"] == 3


def test_memories_with_every_term_rank_before_partial_keyword_matches(school: dict[str, Any]) -> None:
    stack = school["stack"]
    partial = add(stack, "pizza pizza pizza party on friday", embed=False)
    complete = add(stack, "fractions explained with a pizza", embed=False)
    result = search_memories(stack_ids=[stack.pk], query=SearchQuery(text="fractions pizza", min_similarity=0.0))
    assert ids(result.hits) == [str(complete.pk), str(partial.pk)]
    assert [h.keyword_rank for h in result.hits] == [0, 1]
    # Websearch syntax keeps its meaning: an exclusion is not relaxed into "any word".
    excluded = search_memories(stack_ids=[stack.pk], query=SearchQuery(text="pizza -fractions", min_similarity=0.0))
    assert ids(excluded.hits) == [str(partial.pk)]


def test_every_term_matches_survive_when_partial_matches_fill_the_rank_cap(
        school: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Both keyword tiers come from one capped scan; when the partial matches alone fill the cap,
    the memories with every term must still be found (and rank first), not lost behind it."""
    stack = school["stack"]
    partials = [add(stack, f"pizza party number {i}", embed=False) for i in range(6)]  # written first
    complete = [add(stack, f"fractions explained with pizza, take {i}", embed=False) for i in range(2)]
    monkeypatch.setattr("memories.search.keyword_leg.KEYWORD_RANK_CAP", 4)
    result = search_memories(stack_ids=[stack.pk], query=SearchQuery(text="fractions pizza", min_similarity=0.0))
    assert set(ids(result.hits[:2])) == {str(m.pk) for m in complete}
    assert len(result.hits) >= 4
    assert set(ids(result.hits[2:])) <= {str(m.pk) for m in partials}
    # Every keyword rank is there; neighbouring-turn context (§7.5) may reorder the partial matches
    # and add a partial match beyond the cap next to one it found.
    ranks = sorted(h.keyword_rank for h in result.hits if h.keyword_rank is not None)
    assert ranks == list(range(len(ranks)))


def test_the_every_term_rescan_runs_only_when_a_query_term_is_rare_in_the_table(
        school: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """When even the rarest query term is in many rows of the table (ANALYZE's term statistics),
    the every-term rescan through the GIN would cost tens of ms at scale: it is skipped, and the
    matches with every term found in the capped scan still rank first. A query with a rare term
    still gets the rescan."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from memories.search import keyword_leg
    from memories.search.keyword_leg import query_lexemes, strict_scan_is_cheap

    stack = school["stack"]
    complete = [add(stack, f"fractions explained with pizza, take {i}", embed=False) for i in range(2)]
    partials = [add(stack, f"pizza party number {i}", embed=False) for i in range(6)]
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE memories_memory")
    keyword_leg._TERM_STATS.clear()  # a process rereads the statistics at most every few seconds
    monkeypatch.setattr("memories.search.keyword_leg.STRICT_SCAN_MAX_POSTINGS", 1)
    assert not strict_scan_is_cheap(query_lexemes("fractions pizza"))  # both words are in the statistics
    assert strict_scan_is_cheap(query_lexemes("pizza zeppelin"))  # a word the table never saw is rare
    monkeypatch.setattr("memories.search.keyword_leg.KEYWORD_RANK_CAP", 4)

    def keyword_scans(text: str) -> tuple[list[str], int]:
        with CaptureQueriesContext(connection) as queries:
            result = search_memories(stack_ids=[stack.pk], query=SearchQuery(text=text, min_similarity=0.0))
        return ids(result.hits), sum("WITH matched AS MATERIALIZED" in q["sql"] for q in queries.captured_queries)

    common_hits, common_scans = keyword_scans("fractions pizza")
    assert common_scans == 1  # the capped scan only
    assert set(common_hits[:2]) == {str(m.pk) for m in complete}
    assert set(common_hits[2:]) <= {str(m.pk) for m in partials}
    _, rare_scans = keyword_scans("pizza zeppelin")
    assert rare_scans == 2  # the capped scan reached the cap with no every-term match: rescan


@pytest.mark.django_db(transaction=True)
def test_the_scan_choice_follows_the_tables_growth_before_analyze(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bulk import multiplies the rows holding a common word long before autovacuum analyses the
    table: the choice between the GIN walk and the stack's own rows reads the live-row count, so
    it moves with the import instead of walking ever longer posting lists (docs/algorithms.md §7.1)."""
    import time

    from django.db import connection

    from memories.search import keyword_leg
    from memories.search.keyword_leg import query_lexemes, scope_scan_is_cheaper

    org = make_org()
    other = make_stack(org, "importer")
    for i in range(20):
        add(other, f"fractions homework sheet {i}", embed=False)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE memories_memory")
    monkeypatch.setattr(keyword_leg, "_TERM_STATS", {})  # read afresh here; the process's own afterwards
    monkeypatch.setattr("memories.search.keyword_leg.GIN_POSTING_COST_IN_ROWS", 1.0)
    lexemes = query_lexemes("fractions homework")
    assert not scope_scan_is_cheaper(lexemes, scope_rows=100)  # 40 postings: the walk is cheaper

    for i in range(100):  # the import: no ANALYZE runs
        add(other, f"fractions homework sheet {i + 20}", embed=False)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")  # the counts this backend committed
    deadline = time.monotonic() + 10
    while True:
        keyword_leg._TERM_STATS.clear()
        if scope_scan_is_cheaper(lexemes, scope_rows=100) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert scope_scan_is_cheaper(lexemes, scope_rows=100)  # 240 postings now: the stack's own rows


def test_terms_common_in_other_stacks_scan_the_stacks_own_rows_with_the_same_hits(
        school: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A word that fills other stacks' memories makes the table-wide GIN walk decode all their
    postings before a row of this stack is read: the OR scan reads the stack's own rows instead
    (docs/algorithms.md §7.1). A rare word keeps the GIN walk. The hits are the same either way."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from memories.search import keyword_leg
    from memories.search.keyword_leg import query_lexemes, scope_scan_is_cheaper

    stack = school["stack"]
    for i in range(40):
        add(school["other"], f"fractions homework sheet {i}", embed=False)
    found = [add(stack, "fractions homework with pizza", embed=False), add(stack, "homework done early", embed=False)]
    add(stack, "football on Saturday", embed=False)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE memories_memory")
    keyword_leg._TERM_STATS.clear()  # a process rereads the statistics at most every few seconds
    # At this size a posting costs as much as a row; the real ratio is for tables of millions.
    monkeypatch.setattr("memories.search.keyword_leg.GIN_POSTING_COST_IN_ROWS", 1.0)
    assert scope_scan_is_cheaper(query_lexemes("fractions homework"), scope_rows=3)
    assert not scope_scan_is_cheaper(query_lexemes("zeppelin pizza"), scope_rows=3)  # rare: the GIN walk
    assert not scope_scan_is_cheaper(query_lexemes("fractions homework"), scope_rows=10_000)  # a large scope

    def keyword_statement(text: str) -> tuple[list[str], str]:
        with CaptureQueriesContext(connection) as queries:
            result = search_memories(stack_ids=[stack.pk], query=SearchQuery(text=text, min_similarity=0.0))
        [sql] = [q["sql"] for q in queries.captured_queries if "WITH matched AS MATERIALIZED" in q["sql"]]
        return ids(result.hits), sql[sql.index("WITH matched"):]  # the statement, past its deadline

    hits, sql = keyword_statement("fractions homework")
    assert "ts_match_vq(m.search_vector" in sql
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "memories_search_vector_gin" not in plan
    assert hits[:2] == [str(m.pk) for m in found]  # (then the turn next to them, lent context)
    monkeypatch.setattr("memories.search.keyword_leg.scope_scan_is_cheaper", lambda lexemes, scope_rows: False)
    gin_hits, gin_sql = keyword_statement("fractions homework")
    assert "ts_match_vq" not in gin_sql and gin_hits == hits
    _, rare_sql = keyword_statement("zeppelin pizza")
    assert "ts_match_vq" not in rare_sql


@pytest.mark.django_db(transaction=True)
def test_a_stack_with_its_own_index_walks_it_and_one_that_shrank_is_ranked_exactly() -> None:
    from django.db import connection

    from memories.search.vector_indexes import stack_index_name, stack_vector_index_ensure, stacks_with_vector_index

    stack = make_stack(make_org(), "shrinking")
    memories = [add(stack, f"shrinking stack memory {i}") for i in range(40)]
    try:
        assert stack_vector_index_ensure(stack_id=stack.pk, concurrently=True) is True
        stacks_with_vector_index(refresh=True)
        query = SearchQuery(text="memory", limit=10, min_similarity=0.0)  # fetches 30 per leg
        result = search_memories(stack_ids=[stack.pk], query=query)
        assert result.method == "hnsw-stack" and len(result.hits) == 10

        for memory in memories[5:]:
            memory_forget(memory=memory, reason="test")
        result = search_memories(stack_ids=[stack.pk], query=query)
        # Its graph now holds 5 live rows, short of the over-fetch: ranked exactly, all 5 found.
        assert result.method == "hnsw-stack+exact"
        assert sorted(ids(result.hits)) == sorted(str(m.pk) for m in memories[:5])
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP INDEX IF EXISTS "{stack_index_name(stack.pk)}"')
        stacks_with_vector_index(refresh=True)


@pytest.mark.django_db(transaction=True)
def test_a_per_stack_index_built_with_older_parameters_is_rebuilt_under_its_name() -> None:
    from django.db import connection

    from memories.search.vector_indexes import stack_index_name, stack_vector_indexes_sync, stacks_with_vector_index

    stack = make_stack(make_org(), "veteran")
    for i in range(35):  # more than a search's over-fetch (30), so the walk alone serves it
        add(stack, f"veteran stack memory {i}")
    name = stack_index_name(stack.pk)
    try:
        with connection.cursor() as cursor:  # what an earlier release built: 16/64, every row
            cursor.execute(f'CREATE INDEX "{name}" ON memories_memory USING hnsw (embedding vector_cosine_ops) '
                           f"WITH (m = 16, ef_construction = 64) WHERE stack_id = {stack.pk}")
        assert stack.pk in stacks_with_vector_index(refresh=True)
        query = SearchQuery(text="memory", limit=3, min_similarity=0.0)
        assert search_memories(stack_ids=[stack.pk], query=query).method == "hnsw-stack"

        assert stack_vector_indexes_sync(min_rows=10_000) == {"built": 0, "rebuilt": 1, "indexed": 1, "outdated": 0}
        definitions = [d for index, d in index_definitions().items() if index.startswith(name)]
        assert len(definitions) == 1  # the replacement took the name; no temporary index left
        assert definitions[0].endswith(f"WITH (m='24', ef_construction='200') "
                                       f"WHERE ((stack_id = {stack.pk}) AND (forgotten_at IS NULL))")
        assert stack_vector_indexes_sync(min_rows=10_000)["rebuilt"] == 0  # current now: left alone
        result = search_memories(stack_ids=[stack.pk], query=query)
        assert result.method == "hnsw-stack" and len(result.hits) == 3
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP INDEX IF EXISTS "{name}"')
        stacks_with_vector_index(refresh=True)


@pytest.mark.django_db(transaction=True)
def test_large_stacks_get_their_own_partial_vector_index_and_search_uses_it() -> None:
    from django.db import connection

    from memories.search.vector_indexes import stack_index_name, stack_vector_indexes_sync, stacks_with_vector_index

    org = make_org()
    big, small = make_stack(org, "big"), make_stack(org, "small")
    for i in range(30):
        add(big, f"big stack memory {i}")
    add(small, "small stack memory")
    Stack.objects.filter(pk=big.pk).update(memory_count=20_000)
    try:
        assert stack_vector_indexes_sync(min_rows=10_000) == {"built": 1, "rebuilt": 0, "indexed": 1, "outdated": 0}
        assert stack_vector_indexes_sync(min_rows=10_000) == {"built": 0, "rebuilt": 0, "indexed": 1, "outdated": 0}
        assert stacks_with_vector_index() == {big.pk}
        result = search_memories(stack_ids=[big.pk], query=SearchQuery(text="memory", limit=10, min_similarity=0.0))
        assert result.method in ("hnsw-stack", "hnsw-stack+exact")
        assert len(result.hits) == 10
        assert {h.memory.stack_id for h in result.hits} == {big.pk}
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP INDEX IF EXISTS "{stack_index_name(big.pk)}"')
        stacks_with_vector_index(refresh=True)


@pytest.mark.django_db(transaction=True)
def test_every_statement_of_a_search_carries_its_deadline_without_a_transaction(settings: Any) -> None:
    """One stack: 2.5 s (the kernle client gives up at 3 s and searches locally). Several stacks (a
    school key's search, ranked exactly over all their rows, docs/algorithms.md §7.3): 10 s. Each
    statement sends its deadline in its own query string, so no BEGIN and COMMIT cost two round
    trips (§7.4). (The suite runs with a longer deadline, tests/plugin_embedded.py; this test sets
    production's.)"""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    settings.SEARCH_STATEMENT_TIMEOUT_MS, settings.SCHOOL_SEARCH_STATEMENT_TIMEOUT_MS = 2_500, 10_000
    org = make_org()
    first, second = make_stack(org, "first"), make_stack(org, "second")
    add(first, "the timeout of a search")
    add(second, "the timeout of a school search")

    def statements(stack_ids: list[int], text: str) -> list[str]:
        with CaptureQueriesContext(connection) as queries:
            result = search_memories(stack_ids=stack_ids, query=SearchQuery(text=text))
        assert len(result.hits) == len(stack_ids)  # the search still finds each stack's memory
        return [q["sql"] for q in queries.captured_queries]

    for stack_ids, timeout_ms in (([first.pk], 2_500), ([first.pk, second.pk], 10_000)):
        statements(stack_ids, "search timeout")  # the process's catalog reads, cached for seconds, done
        sent = statements(stack_ids, "search timeout")
        assert len(sent) >= 4  # the first statement, the keyword leg, the vector leg, the context and page
        assert all(sql.startswith(f"SET LOCAL statement_timeout = {timeout_ms}; ") for sql in sent), sent


def test_a_search_inside_a_callers_transaction_runs_in_a_savepoint(school: dict[str, Any]) -> None:
    """A search cancelled at its deadline inside a caller's transaction must not break the caller's
    transaction: there it runs in a savepoint, its statements still under the deadline."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    add(school["stack"], "a search inside a transaction")
    with CaptureQueriesContext(connection) as queries:
        search_memories(stack_ids=[school["stack"].pk], query=SearchQuery(text="search transaction"))
    sent = [q["sql"] for q in queries.captured_queries]
    assert sent[0].startswith("SAVEPOINT") and sent[-1].startswith("RELEASE SAVEPOINT"), sent
    reads = [sql for sql in sent if "FROM memories_memory" in sql]
    assert reads and all(sql.startswith("SET LOCAL statement_timeout = ") for sql in reads), reads
