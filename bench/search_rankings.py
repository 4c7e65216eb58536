"""The benchmark's search rankings: ranking v1 and the ablations of docs/algorithms.md §7.5.

The service has one ranking (memories.search.hybrid: BM25 keyword leg, score fusion,
neighbouring-turn context). To measure what each of those changes brings, and what the whole
costs, bench/retrieval_quality.py and bench/search.py also search with:

* ranking v1 (§7.2): the keyword leg ranked by ts_rank in two tiers (every term, then some), the
  legs fused by reciprocal rank (1 / (RRF_K + rank) per leg), no context;
* the ablations: v1 with one or more of v2's changes (`ABLATIONS`).

`search_ranked` runs the service's own pieces (its filters, legs, weight, context and page), with
v1's keyword leg and fusion where a ranking leaves a change out; a ranking with every change
searches as the service does. Nothing in the service imports this module.
"""

from __future__ import annotations

if __name__ == "__main__":  # a library of the search benchmarks, not a benchmark of its own
    import argparse

    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run it through bench/retrieval_quality.py (--ablation) or bench/search.py.").parse_args()
    print("bench/search_rankings.py: run bench/retrieval_quality.py --ablation or bench/search.py")
    raise SystemExit(0)

import time
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from memories.search import keyword_leg as keyword
from memories.search.embedding_model import DEPLOYMENT_MODEL_SQL
from memories.search.fusion import (
    FUSION_DEPTH,
    RRF_K,
    lend_context,
    merge_candidates,
    page_hits,
    rank_candidates,
    weighted,
)
from memories.search.hybrid import above_min_similarity, query_model_or_skip
from memories.search.query import (
    LEG_COLUMNS,
    LEG_RAN,
    MAX_LIMIT,
    SCORE,
    SKIPPED_EMBEDDER_UNAVAILABLE,
    SearchQuery,
    SearchResult,
    fetch_rows,
    is_plain,
    over_fetch,
    scope_filters,
)
from memories.search.vector_leg import embed_in_background, vector_leg, why_no_vectors

# Which of v2's changes (§7.5) a ranking uses; the service uses all three.
BM25, SCORE_FUSION, CONTEXT = "bm25", "score_fusion", "context"
RANKINGS: dict[str, frozenset[str]] = {"v1": frozenset()}
ABLATIONS: dict[str, frozenset[str]] = {
    "v1 + bm25": frozenset({BM25}),
    "v1 + context": frozenset({CONTEXT}),
    "v1 + bm25 + score fusion": frozenset({BM25, SCORE_FUSION}),
    "v2 without bm25": frozenset({SCORE_FUSION, CONTEXT}),
}


def search_ranked(ranking: str, *, stack_ids: Sequence[int], query: SearchQuery) -> SearchResult:
    """`memories.search.hybrid.search_memories`, ranked by `ranking` (a key of RANKINGS or ABLATIONS)."""
    features = {**RANKINGS, **ABLATIONS}[ranking]
    started = time.perf_counter()
    now = timezone.now()
    stats: dict[str, Any] = {}
    fetch = over_fetch(query.limit)
    timeout_ms = (settings.SEARCH_STATEMENT_TIMEOUT_MS if len(stack_ids) == 1
                  else settings.SCHOOL_SEARCH_STATEMENT_TIMEOUT_MS)
    inputs = None
    with transaction.atomic():
        with connection.cursor() as cursor:
            first = f"SELECT set_config('statement_timeout', %s, true), ({DEPLOYMENT_MODEL_SQL})"
            if BM25 in features:
                cursor.execute(f"{first}, {keyword.LEXEMES_SQL}, ({keyword.SCOPE_MEMORIES_SQL})",
                               [f"{int(timeout_ms)}ms", query.text, list(stack_ids)])
                _, stored_model, lexemes, scope_rows = cursor.fetchone()
                inputs = keyword.KeywordInputs(lexemes=list(lexemes), scope_rows=int(scope_rows))
            else:
                cursor.execute(first, [f"{int(timeout_ms)}ms"])
                _, stored_model = cursor.fetchone()
        return _search(features, stack_ids=stack_ids, query=query, now=now, fetch=fetch, stats=stats,
                       started=started, stored_model=stored_model, inputs=inputs)


def _search(features: frozenset[str], *, stack_ids: Sequence[int], query: SearchQuery, now: Any, fetch: int,
            stats: dict[str, Any], started: float, stored_model: str | None,
            inputs: keyword.KeywordInputs | None) -> SearchResult:
    """memories.search.hybrid._search, with each of v2's changes taken only when `features` has it."""
    query_model, semantic_skipped = query_model_or_skip(stored_model)
    pending = None if semantic_skipped else embed_in_background(query.text)
    fusion = SCORE_FUSION in features
    depth = max(fetch, min(FUSION_DEPTH, MAX_LIMIT)) if fusion else fetch
    if inputs is not None:
        keyword_rows = keyword.keyword_leg(query, stack_ids, depth, None, inputs)
    else:
        keyword_rows = keyword_leg_v1(query, stack_ids, depth)
    similarities: dict[Any, float] = {}
    vector_rows: list[tuple[Any, ...]] = []
    method = "none"
    if pending is not None:
        try:
            vector, stats["embed_ms"] = pending.result()
        except Exception:
            semantic_skipped = SKIPPED_EMBEDDER_UNAVAILABLE
        else:
            vector_rows, method = vector_leg(query, stack_ids, vector, fetch, stats, None, depth,
                                             also=[row[0] for row in keyword_rows] if fusion else (),
                                             similarities=similarities)
            if not vector_rows:
                semantic_skipped = why_no_vectors(query, stack_ids, query_model, None)
    vector_rows = above_min_similarity(query, vector_rows)

    candidates = merge_candidates(keyword_rows, vector_rows, similarities)
    if fusion:
        scored = rank_candidates(candidates, now)
    else:
        scored = sorted(((weighted(entry, rrf(entry), now), memory_id, entry)
                         for memory_id, entry in candidates.items()), key=lambda item: (-item[0], str(item[1])))
    page: dict[Any, Sequence[Any]] = {}
    if CONTEXT in features and is_plain(query.text):
        scored = lend_context(scored, candidates, query, stack_ids, now, None, stats, page)
    return SearchResult(hits=page_hits(scored[: query.limit], page), method=method,
                        took_ms=(time.perf_counter() - started) * 1000, embedding_model=query_model, stats=stats,
                        legs={"keyword": LEG_RAN, "semantic": semantic_skipped or LEG_RAN})


def rrf(entry: dict[str, Any]) -> float:
    """v1's fusion (§7.2): Σ over the legs that found the memory of 1 / (RRF_K + rank), rank from 0."""
    return sum(1.0 / (RRF_K + entry[leg]) for leg in ("keyword_rank", "semantic_rank") if leg in entry)


def _ts_rank_sql(where: str, tsquery_sql: str, *, all_terms_sql: str, score_sql: str, limit: int) -> str:
    """v1's keyword statement: the matching rows (at most KEYWORD_RANK_CAP) ranked by `score_sql`
    (a ts_rank), every-term rows first; `matched` says whether the cap was reached."""
    return f"""
        WITH matched AS MATERIALIZED (
                 SELECT {LEG_COLUMNS}, m.search_vector, {all_terms_sql} AS all_terms
                   FROM memories_memory m
                  WHERE {where} AND numnode({tsquery_sql}) > 0 AND m.search_vector @@ {tsquery_sql}
                  LIMIT %(cap)s)
        SELECT {LEG_COLUMNS.replace("m.", "h.")}, h.all_terms, {score_sql} AS score,
               count(*) OVER () AS matched
          FROM matched h
         ORDER BY h.all_terms DESC, score DESC, h.id
         LIMIT {int(limit)}
    """


def keyword_leg_v1(query: SearchQuery, stack_ids: Sequence[int], fetch: int) -> list[tuple[Any, ...]]:
    """v1's keyword leg: full-text candidates in two tiers from one scan, each ranked by ts_rank.

    1. Memories containing every term (websearch_to_tsquery), ranked against that query.
    2. Only for plain-word queries: memories containing some of the terms (the AND relaxed to OR),
       after every tier-1 hit, ranked against the relaxed query.

    Only when the scan reached KEYWORD_RANK_CAP before finding `fetch` tier-1 rows does tier 1 get
    a scan of its own - unless every term is common in the table (keyword_leg.strict_scan_is_cheap).
    """
    params: dict[str, Any] = {"stack_ids": list(stack_ids), "q": query.text, "cap": keyword.KEYWORD_RANK_CAP}
    where = scope_filters(query, params)
    strict = "websearch_to_tsquery('english', %(q)s)"
    strict_sql = _ts_rank_sql(where, strict, all_terms_sql="true",
                              score_sql=f"ts_rank(h.search_vector, {strict}, 1)", limit=fetch)
    if not is_plain(query.text):
        return [row[:-1] for row in fetch_rows(strict_sql, params)]
    loose = f"replace({strict}::text, ' & ', ' | ')::tsquery"
    loose_sql = _ts_rank_sql(where, loose, all_terms_sql=f"(m.search_vector @@ {strict})",
                             score_sql=(f"CASE WHEN h.all_terms THEN ts_rank(h.search_vector, {strict}, 1) "
                                        f"ELSE ts_rank(h.search_vector, {loose}, 1) END"), limit=fetch)
    rows = fetch_rows(loose_sql, params)
    complete = not rows or int(rows[0][-1]) < keyword.KEYWORD_RANK_CAP
    first_tier = [row[:-1] for row in rows if row[SCORE]]
    if complete or len(first_tier) >= fetch or not keyword.strict_scan_is_cheap(keyword.query_lexemes(query.text)):
        return [row[:-1] for row in rows]
    first_tier = [row[:-1] for row in fetch_rows(strict_sql, params)]
    return (first_tier + [row[:-1] for row in rows if not row[SCORE]])[:fetch]
