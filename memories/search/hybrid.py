"""Hybrid search: PostgreSQL full text (BM25) and pgvector cosine, fused by their scores
(docs/algorithms.md §7).

`search_memories` is the one entry: it runs the keyword leg (memories.search.keyword_leg) while
the query is embedded, then the vector leg (memories.search.vector_leg), and fuses and ranks their
candidates (memories.search.fusion, where the ranking is stated); the request and answer shapes are
memories.search.query's. There is one ranking; the benchmark's baselines (the earlier reciprocal
rank ranking and the ablations of §7.5) live in bench/search_rankings.py, outside this path.

Each leg over-fetches (3x the limit, at least 30, at most max(limit, 100)) before fusion.
`min_similarity` applies only to the semantic leg, so a keyword-only hit is never dropped.
The stack filter, deletion, forgetting, expiry, kind, tags and time range are all inside SQL.

Which legs ran (`SearchResult.legs`, docs/algorithms.md §7.1): a search never drops to keyword-only
without saying so. The semantic leg is skipped - and says why - when the query would be embedded
with another model than the deployment's stored vectors (memories.search.embedding_model), when the
embedder fails (the keyword leg still answers), or when no memory in scope has a vector yet.
`SearchResult.method` reports the vector leg's plan.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from contextlib import nullcontext
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from memories.privacy.grants import Audience
from memories.search.embedding_model import DEPLOYMENT_MODEL_SQL
from memories.search.embeddings import get_embedder
from memories.search.fusion import FUSION_DEPTH, lend_context, merge_candidates, page_hits, rank_candidates
from memories.search.keyword_leg import LEXEMES_SQL, SCOPE_MEMORIES_SQL, KeywordInputs, keyword_leg
from memories.search.query import (
    LEG_RAN,
    MAX_LIMIT,
    SCORE,
    SKIPPED_EMBEDDER_UNAVAILABLE,
    SKIPPED_NOTHING_TO_SEARCH,
    SearchQuery,
    SearchResult,
    execute_under_deadline,
    is_plain,
    over_fetch,
    search_deadline,
    skipped_model_mismatch,
)
from memories.search.vector_leg import embed_in_background, vector_leg, why_no_vectors
from memoryhub.errors import ServiceUnavailable
from memoryhub.metrics import SEARCH_LATENCY

logger = logging.getLogger(__name__)


def search_memories(*, stack_ids: Sequence[int], query: SearchQuery,
                    audience: Audience | None = None) -> SearchResult:
    """Hybrid search over the given stacks. The caller has already decided the caller may read
    every one of `stack_ids` (stacks.selectors); this function never widens that scope.
    `audience`: the requester when it is not the stacks' own credentials (memories.privacy.grants.audience_for);
    None searches everything in scope (the stack's own agent, a system job)."""
    started = time.perf_counter()
    now = timezone.now()
    stats: dict[str, Any] = {}
    if not stack_ids or not query.text.strip():
        return SearchResult(hits=[], method="none", legs={"keyword": SKIPPED_NOTHING_TO_SEARCH,
                                                          "semantic": SKIPPED_NOTHING_TO_SEARCH})
    fetch = over_fetch(query.limit)
    # Kernle's client gives up after 3 s and searches locally; a query that cannot finish well
    # inside that is cancelled (-> 503, which also makes the client fall back). Several stacks are
    # a school key's search (never the kernle client's), ranked exactly over all their rows (§7.3).
    timeout_ms = (settings.SEARCH_STATEMENT_TIMEOUT_MS if len(stack_ids) == 1
                  else settings.SCHOOL_SEARCH_STATEMENT_TIMEOUT_MS)
    # No transaction of its own: each statement carries the deadline (memories.search.query). Inside
    # a caller's transaction, a savepoint: a search cancelled at its deadline must not break it.
    with search_deadline(timeout_ms), (transaction.atomic() if connection.in_atomic_block else nullcontext()):
        with connection.cursor() as cursor:
            # The first statement reads the deployment's embedding model; what the BM25 leg needs
            # besides its scan - the query's lexemes and N - rides on it: no round trip of their own.
            execute_under_deadline(cursor, f"SELECT ({DEPLOYMENT_MODEL_SQL}), {LEXEMES_SQL}, ({SCOPE_MEMORIES_SQL})",
                                   [query.text, list(stack_ids)])
            stored_model, lexemes, scope_rows = cursor.fetchone()
        inputs = KeywordInputs(lexemes=list(lexemes), scope_rows=int(scope_rows))
        result = _search(stack_ids=stack_ids, query=query, now=now, fetch=fetch, stats=stats, started=started,
                         audience=audience, stored_model=stored_model, inputs=inputs)
    SEARCH_LATENCY.observe(time.perf_counter() - started)
    return result


def _search(*, stack_ids: Sequence[int], query: SearchQuery, now: datetime, fetch: int, stats: dict[str, Any],
            started: float, audience: Audience | None, stored_model: str | None,
            inputs: KeywordInputs) -> SearchResult:
    """`stored_model`: the deployment's embedding model (memories.search.embedding_model), None
    before anything was embedded."""
    query_model, semantic_skipped = query_model_or_skip(stored_model)
    # The query embedding (CPU) runs while the keyword leg waits on the database, so a search
    # costs max(embed, keyword) + vector rather than their sum.
    clock = time.perf_counter()
    pending = None if semantic_skipped else embed_in_background(query.text)
    # Score fusion may read deeper lists (§7.5). At FUSION_DEPTH = 30 `fetch` (>= 30) already
    # covers it; the knob stays for the grid. The keyword leg scores every matching row (up to
    # KEYWORD_RANK_CAP) whatever its LIMIT, and the vector leg's walk stays sized by `fetch`,
    # so extra rows would cost only their transfer.
    depth = max(fetch, min(FUSION_DEPTH, MAX_LIMIT))
    keyword_rows = keyword_leg(query, stack_ids, depth, audience, inputs)
    similarities: dict[Any, float] = {}  # the cosine of every keyword candidate
    stats["keyword_ms"] = round((time.perf_counter() - clock) * 1000, 2)
    vector_rows: list[tuple[Any, ...]] = []
    method = "none"
    if pending is not None:
        try:
            vector, stats["embed_ms"] = pending.result()
        except Exception as exc:  # an embedding service down, a model that failed to load: keyword only
            # The exception's type only: its message could quote the query.
            logger.warning("search: the query embedding failed (%s); semantic leg skipped", type(exc).__name__)
            semantic_skipped = SKIPPED_EMBEDDER_UNAVAILABLE
        else:
            clock = time.perf_counter()
            vector_rows, method = vector_leg(query, stack_ids, vector, fetch, stats, audience, depth,
                                             also=[row[0] for row in keyword_rows], similarities=similarities)
            stats["vector_ms"] = round((time.perf_counter() - clock) * 1000, 2)
            if not vector_rows:
                semantic_skipped = why_no_vectors(query, stack_ids, query_model, audience)
    vector_rows = above_min_similarity(query, vector_rows)

    candidates = merge_candidates(keyword_rows, vector_rows, similarities)
    scored = rank_candidates(candidates, now)
    page: dict[Any, Sequence[Any]] = {}  # rows of memories that may make the page, read with the context
    if is_plain(query.text):
        # Only for plain words: quotes, `or` and -exclusions ask for exactly the matching memories.
        scored = lend_context(scored, candidates, query, stack_ids, now, audience, stats, page)
    hits = page_hits(scored[: query.limit], page)
    stats.update(keyword_candidates=len(keyword_rows), semantic_candidates=len(vector_rows))
    return SearchResult(
        hits=hits,
        method=method,
        took_ms=(time.perf_counter() - started) * 1000,
        embedding_model=query_model,
        stats=stats,
        legs={"keyword": LEG_RAN, "semantic": semantic_skipped or LEG_RAN},
    )


def query_model_or_skip(stored_model: str | None) -> tuple[str, str | None]:
    """(the model this process embeds queries with, or "" when it cannot; why the semantic leg is
    skipped, or None). A query vector is only comparable with stored vectors of its own model: when
    this process embeds with another model than the deployment's, the semantic leg is skipped, and
    says so."""
    try:
        query_model = get_embedder().model_id
    except ServiceUnavailable:  # e.g. EMBEDDING_PROVIDER=openai without EMBEDDING_API_URL
        query_model = ""
    if not query_model:
        return query_model, SKIPPED_EMBEDDER_UNAVAILABLE
    if stored_model is not None and stored_model != query_model:
        return query_model, skipped_model_mismatch(query_model=query_model, stored_model=stored_model)
    return query_model, None


def above_min_similarity(query: SearchQuery, vector_rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The vector leg's rows at or above the query's `min_similarity` (0 means "no threshold":
    cosine itself can be negative)."""
    if query.min_similarity > 0:
        return [row for row in vector_rows if float(row[SCORE]) >= query.min_similarity]
    return vector_rows
