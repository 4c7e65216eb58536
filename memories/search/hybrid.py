"""Hybrid search: Postgres full text + pgvector cosine, fused by reciprocal rank fusion.

The ranking, stated once so it can be tested (docs/algorithms.md §7.2):

    rrf(d)      = Σ over the legs that found d of 1 / (60 + rank), rank counted from 0
    retention   = FSRS retrievability R(t, S) of the memory (memories.lifecycle.decay.memory_retrievability:
                  t = days since last review or creation, S = its effective stability)
    recency     = 0.95 ^ min(age in days, 30)
    weight      = (0.6 + 0.4·retention) · (0.6 + 0.4·confidence) · (0.85 + 0.15·recency)
    combined    = rrf · weight / (2/60)                      ∈ [0, 1]

so a memory ranked first by both legs, fully retained, fully confident and new scores 1.0.
That is ranking "v1", kept selectable for the benchmark. The default, "v2" (docs/algorithms.md §7.5),
keeps the weight and the scale but scores the keyword leg with BM25, fuses the legs' scores
(0.4 keyword + 0.6 min-max cosine, times 2/60) instead of their ranks, and lets the best hits lend
0.3 of their score to the turns just before and after (0.15 two away; memories.search.context);
`SearchHit.boosts` says so.

Each leg over-fetches (3x the limit, at least 30, at most max(limit, 100)) before fusion.
`min_similarity` applies only to the semantic leg, so a keyword-only hit is never dropped.
The stack filter, deletion, forgetting, expiry, kind, tags and time range are all inside SQL.

Vector leg and the "k hits whenever k exist" rule (method names in brackets): a stack with its
own partial HNSW index (memories.search.vector_indexes; stacks above 10,000 memories) is walked
through that graph [hnsw-stack], and ranked exactly instead whenever the walk yields too few rows
[hnsw-stack+exact]. Every other scope - a smaller stack, or several stacks of a school - is ranked
exactly (the stack-leading B-tree, then a sort of the scope's rows) [exact]. There is no
table-wide vector index: pgvector 0.6 filters a shared graph's results after the walk, so it
served one stack poorly, and keeping it up to date was most of the database's work under load
(docs/algorithms.md §7.3).
`SearchResult.method` reports which ran.

Which legs ran (`SearchResult.legs`, docs/algorithms.md §7.1): a search never drops to keyword-only
without saying so. The semantic leg is skipped - and says why - when the query would be embedded
with another model than the deployment's stored vectors (memories.search.embedding_model), when the
embedder fails (the keyword leg still answers), or when no memory in scope has a vector yet.

Why one module of ~900 lines: the two legs share one filter builder and one column contract
(`_filters`, `_LEG_COLUMNS`/`_SCORE`) that the fusion reads by position; split apart, a reader
would have to hold three files open to check that they agree.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from memories.lifecycle.decay import DecayState, memory_retrievability
from memories.models import Memory
from memories.privacy.grants import Audience, grants_sql
from memories.search.context import MEMORY_FIELDS, memories_from_rows, neighbour_rows, uuid_array
from memories.search.embedding_model import DEPLOYMENT_MODEL_SQL
from memories.search.embeddings import Vector, embed_query, get_embedder, vector_literal
from memories.search.vector_indexes import stacks_with_vector_index
from memoryhub.errors import ServiceUnavailable
from memoryhub.metrics import SEARCH_LATENCY
from stacks.models import Stack

logger = logging.getLogger(__name__)

RRF_K = 60
MAX_LIMIT = 100
MAX_QUERY_CHARS = 2000
DEFAULT_MIN_SIMILARITY = 0.25  # MiniLM: unrelated text sits around 0-0.15, paraphrases above 0.5
KEYWORD_RANK_CAP = 1_000
STATEMENT_TIMEOUT_MS = 2_500
# A school-wide search ranks every row of its stacks exactly (~1.2 µs a row, docs/algorithms.md §7.3):
# a school of a million memories needs more than a stack's 2.5 s on a busy box.
SCHOOL_STATEMENT_TIMEOUT_MS = 10_000
HNSW_MAX_EF_SEARCH = 1000  # pgvector's upper bound for hnsw.ef_search
STACK_INDEX_MIN_EF_SEARCH = 240  # a per-stack index's walk width (see _vector_leg)

# What `SearchResult.legs` says of a leg: "ran", or "skipped: <one of these reasons>".
LEG_RAN = "ran"
SKIPPED_EMBEDDER_UNAVAILABLE = "skipped: embedder unavailable"
SKIPPED_NOT_EMBEDDED_YET = "skipped: no embedded memories yet"
SKIPPED_NOTHING_TO_SEARCH = "skipped: nothing to search"


def skipped_model_mismatch(*, query_model: str, stored_model: str) -> str:
    return f"skipped: model mismatch (queries are embedded with {query_model}, the stored vectors with {stored_model})"




@dataclass(frozen=True)
class SearchQuery:
    text: str
    limit: int = 10
    kinds: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()  # any of these tags
    created_after: datetime | None = None
    created_before: datetime | None = None
    min_similarity: float = DEFAULT_MIN_SIMILARITY
    ranking: str = "v2"  # a key of RANKINGS; "v1" is the ranking before issue 20, kept for the benchmark


# Which ranking changes (docs/algorithms.md §7.5) a ranking uses. The API always searches with the
# default; "v1" and the ablations exist so bench/retrieval_quality.py can measure before and after,
# and each change on its own, in one run.
RANKINGS: dict[str, frozenset[str]] = {
    "v1": frozenset(),
    "v2": frozenset({"bm25", "score_fusion", "context"}),
}
DEFAULT_RANKING = "v2"
ABLATIONS: dict[str, frozenset[str]] = {
    "v1 + bm25": frozenset({"bm25"}),
    "v1 + context": frozenset({"context"}),
    "v1 + bm25 + score fusion": frozenset({"bm25", "score_fusion"}),
    "v2 without bm25": frozenset({"score_fusion", "context"}),
}


@dataclass
class SearchHit:
    memory: Memory
    combined_score: float
    fused_score: float  # raw RRF sum, before weighting
    keyword_score: float | None  # ts_rank normalised by the best keyword hit, in [0, 1]
    semantic_score: float | None  # cosine similarity, clamped to [0, 1]
    keyword_rank: int | None
    semantic_rank: int | None
    retention: float
    weight: float
    # What lifted the hit above its legs' own score (§7.5): {"context": the score its neighbour lent}.
    boosts: dict[str, float] = field(default_factory=dict)
    context_of: Any = None  # the id of the hit that lent the context boost

    @property
    def match_type(self) -> str:
        if self.keyword_rank is not None and self.semantic_rank is not None:
            return "both"
        return "keyword" if self.keyword_rank is not None else "semantic"


@dataclass
class SearchResult:
    hits: list[SearchHit]
    method: str  # exact | hnsw-stack | hnsw-stack+exact (the vector leg's plan), or none (no vector leg)
    took_ms: float = 0.0
    embedding_model: str = ""
    stats: dict[str, Any] = field(default_factory=dict)
    # Each leg: "ran" or "skipped: <reason>" (see the module docstring).
    legs: dict[str, str] = field(default_factory=lambda: {"keyword": LEG_RAN, "semantic": LEG_RAN})


def ranking_weight(*, retention: float, confidence: float, age_days: float) -> float:
    recency = 0.95 ** min(max(age_days, 0.0), 30.0)
    confidence = min(max(confidence, 0.0), 1.0)
    return (0.6 + 0.4 * retention) * (0.6 + 0.4 * confidence) * (0.85 + 0.15 * recency)


def over_fetch(limit: int) -> int:
    return max(limit, min(max(3 * limit, 30), MAX_LIMIT))


@cache
def pgvector_version() -> tuple[int, ...]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        row = cursor.fetchone()
    return tuple(int(p) for p in re.findall(r"\d+", row[0] if row else "0"))


_PLAIN_QUERY = re.compile(r'^[^"]*$')


def _is_plain(text: str) -> bool:
    """Plain words: no websearch syntax (quotes, `or`, -exclusions)."""
    return bool(_PLAIN_QUERY.match(text)) and not re.search(r"(^|\s)-\w|\bor\b", text, re.I)


def _filters(query: SearchQuery, params: dict[str, Any], audience: Audience | None = None) -> str:
    """The WHERE clause every leg shares; the stack scope is mandatory, never optional. A requester
    other than the stack's own credentials also gets the privacy-grants predicate (memories.privacy.grants),
    here, inside each leg's SQL and before its LIMIT, so a hidden memory never takes a slot."""
    clauses = [
        "m.stack_id = ANY(%(stack_ids)s)",
        "m.deleted_at IS NULL",
        "m.forgotten_at IS NULL",
        "(m.expires_at IS NULL OR m.expires_at > %(now)s)",
    ]
    params["now"] = timezone.now()
    if audience is not None:
        grants, grant_params = grants_sql(audience, "m")
        clauses.append(grants)
        params.update(grant_params)
    if query.kinds:
        clauses.append("m.kind = ANY(%(kinds)s)")
        params["kinds"] = list(query.kinds)
    if query.tags:
        clauses.append("m.tags && %(tags)s::text[]")
        params["tags"] = list(query.tags)
    if query.created_after:
        clauses.append("m.created_at >= %(after)s")
        params["after"] = query.created_after
    if query.created_before:
        clauses.append("m.created_at < %(before)s")
        params["before"] = query.created_before
    return " AND ".join(clauses)


# Everything the ranking weight needs, so fusion never goes back to the table for candidates.
_LEG_COLUMNS = ("m.id, m.stability, m.confidence, m.created_at, m.last_reviewed_at, m.kind, m.times_accessed, "
                "m.emotional_valence, m.emotional_arousal")
_SCORE = 9  # index of the leg's own score column (after _LEG_COLUMNS)
# Where each leg column sits in a context row (memories.search.context.MEMORY_FIELDS).
_LEG_FIELD_INDEXES = tuple([f.column for f in MEMORY_FIELDS].index(column.removeprefix("m."))
                           for column in _LEG_COLUMNS.split(", "))


# BM25 (Robertson/Sparck Jones), the textbook constants: k1 = 1.2 saturates a term's repeats (a
# third "pizza" adds little), b = 0.75 normalises for length (a long memory matches more words by
# chance). On the LoCoMo dev split k1 1.2 / b 0.75 were within noise of the best of a small grid.
BM25_K1 = 1.2
BM25_B = 0.75


def _bm25_keyword_sql(where: str, tsquery_sql: str, *, all_terms_sql: str, lexemes: int, limit: int) -> str:
    """The keyword leg scored by BM25 rather than ts_rank (docs/algorithms.md §7.5).

    tf = the lexeme's positions in the memory's tsvector, dl = the tsvector's length (distinct
    lexemes), avgdl = the mean over the matched rows, df = how many matched rows hold the lexeme and
    N = the scope's memories (%(scope_rows)s, see `_keyword_leg`). The matched rows are every row of the scope holding
    any query term (the OR query), so df is exact unless the scan reached KEYWORD_RANK_CAP - then df
    counts within those rows, which only happens for terms common enough to carry little weight.

    Cost (§7.5 "Cost"): no set-returning function and no copy of the tsvector per matched row -
    unnesting each row's tsvector cost ~2-3 µs a row, and cutting it down to its query lexemes
    (setweight + ts_filter, then its text) ~1.4 µs. Every query lexeme i is a parameter,
    %(term_<i>)s = a one-lexeme tsquery (`_bm25_params`); each matched row gets tf_<i> once, 0 when
    absent: presence is `@@` (a binary search in the row's sorted lexemes) and the count is read
    from ts_rank (`_tf_sql`). df and the score then read those columns, not the tsvector."""
    tfs = ", ".join(f"CASE WHEN m.search_vector @@ %(term_{i})s::tsquery THEN {_tf_sql(i)} ELSE 0 END AS tf_{i}"
                    for i in range(lexemes))
    df = ", ".join(f"count(*) FILTER (WHERE h.tf_{i} > 0) AS df_{i}" for i in range(lexemes))
    idf = ", ".join(f"ln(1 + (greatest(scope_rows, df_{i}) - df_{i} + 0.5::float8) / (df_{i} + 0.5::float8)) "
                    f"AS idf_{i}" for i in range(lexemes))
    # tf·(k1+1)/(tf + norm), written as (k1+1) - (k1+1)·norm/(tf + norm) so tf is read once. An
    # absent lexeme (tf 0) adds exactly 0 without a CASE: norm ≥ k1·(1 - b) > 0 and x/x is exactly 1.
    score = " + ".join(f"s.idf_{i} * ({BM25_K1} + 1) * (1 - n.norm / (h.tf_{i} + n.norm))" for i in range(lexemes))
    return f"""
        WITH matched AS MATERIALIZED (
                 SELECT {_LEG_COLUMNS}, {all_terms_sql} AS all_terms, length(m.search_vector)::float8 AS dl, {tfs}
                   FROM memories_memory m
                  WHERE {where} AND numnode({tsquery_sql}) > 0 AND m.search_vector @@ {tsquery_sql}
                  LIMIT %(cap)s),
             stats AS (SELECT greatest(avg(dl), 1) AS avgdl, count(*) AS matched,
                              %(scope_rows)s::bigint AS scope_rows, {df} FROM matched h),
             -- MATERIALIZED: computed once, not folded into every row's score.
             idf AS MATERIALIZED (SELECT avgdl, matched, scope_rows, {idf} FROM stats)
        SELECT {_LEG_COLUMNS.replace("m.", "h.")}, h.all_terms, ({score}) AS score, s.matched
          FROM matched h CROSS JOIN idf s
               CROSS JOIN LATERAL (SELECT {BM25_K1} * (1 - {BM25_B} + {BM25_B} * h.dl / s.avgdl) AS norm) n
         ORDER BY score DESC, h.id
         LIMIT {int(limit)}
    """  # noqa: S608 - only fixed clauses are interpolated; values are parameters


# π²/6, the limit of Σ 1/j² - the constant PostgreSQL's ts_rank divides by (tsrank.c, calc_rank_or).
_ZETA_2 = 1.64493406685


def _tf_sql(i: int) -> str:
    """How many positions query lexeme i has in the row's tsvector, from ts_rank: with every weight
    1 and no normalisation, ts_rank of a one-lexeme query is H(tf) / (π²/6), H(n) = Σ_{j<=n} 1/j²
    (PostgreSQL's calc_rank_or). π²/6 - H(n) is within a few percent of 1/(n + ½), so n =
    round(1/(π²/6 - H) - ½) - exact for every tf a tsvector can hold (at most 256 positions),
    float4 rounding included (tests/memories/test_search_quality.py checks 1 to 256). One function
    call on the row's tsvector (alias `m`), no copy of it."""
    rank = f"ts_rank('{{1,1,1,1}}', m.search_vector, %(term_{i})s::tsquery, 0)"
    return f"round(1 / ({_ZETA_2} * (1 - {rank})) - 0.5)"


# Above this many query lexemes the per-lexeme expressions cost more to plan than unnesting the
# matched rows' query lexemes costs to run (a pasted paragraph: 123 lexemes planned in ~100 ms more
# than v1 on the dev stacks); such a query is scored by the unnest form, which gives the same
# scores at a cost that follows the matched rows, not the terms.
BM25_INLINE_MAX_LEXEMES = 32


def _bm25_unnest_sql(where: str, tsquery_sql: str, *, all_terms_sql: str, limit: int) -> str:
    """`_bm25_keyword_sql`'s scores, by unnesting each matched row's query lexemes (the long-query form)."""
    return f"""
        WITH matched AS MATERIALIZED (
                 SELECT {_LEG_COLUMNS}, {all_terms_sql} AS all_terms, length(m.search_vector)::float8 AS dl,
                        ts_filter(setweight(m.search_vector, 'A', %(lexemes)s::text[]), '{{a}}') AS query_terms
                   FROM memories_memory m
                  WHERE {where} AND numnode({tsquery_sql}) > 0 AND m.search_vector @@ {tsquery_sql}
                  LIMIT %(cap)s),
             terms AS MATERIALIZED (
                 SELECT h.id, u.lexeme, coalesce(array_length(u.positions, 1), 1) AS tf, h.dl
                   FROM matched h, unnest(h.query_terms) u),
             stats AS MATERIALIZED (SELECT greatest(avg(dl), 1) AS avgdl, count(*) AS matched,
                                           %(scope_rows)s::bigint AS scope_rows FROM matched),
             idf AS MATERIALIZED (
                 SELECT lexeme, ln(1 + (greatest(max(s.scope_rows), count(*)) - count(*) + 0.5::float8)
                                   / (count(*) + 0.5::float8)) AS idf
                   FROM terms CROSS JOIN stats s GROUP BY lexeme),
             bm25 AS (
                 SELECT t.id, sum(i.idf * t.tf * ({BM25_K1} + 1)
                                  / (t.tf + {BM25_K1} * (1 - {BM25_B} + {BM25_B} * t.dl / s.avgdl))) AS score
                   FROM terms t JOIN idf i USING (lexeme) CROSS JOIN stats s
                  GROUP BY t.id)
        SELECT {_LEG_COLUMNS.replace("m.", "h.")}, h.all_terms, coalesce(b.score, 0) AS score, s.matched
          FROM matched h CROSS JOIN stats s LEFT JOIN bm25 b ON b.id = h.id
         ORDER BY score DESC, h.id
         LIMIT {int(limit)}
    """  # noqa: S608 - only fixed clauses are interpolated; values are parameters


def _bm25_params(lexemes: Sequence[str]) -> dict[str, Any]:
    """The lexemes and, for each, a tsquery of that one lexeme as a literal (tsquery input: quoted
    with ' and \\ doubled inside, so it is read as the lexeme itself, never parsed or stemmed again)."""
    terms = {f"term_{i}": "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"
             for i, lexeme in enumerate(lexemes)}
    return {"lexemes": list(lexemes), **terms}


_LEXEMES_SQL = "tsvector_to_array(to_tsvector('english', %s))"


def _query_lexemes(text: str) -> list[str]:
    """The query's distinct lexemes as the english configuration makes them (what search_vector
    holds). A v2 search reads them with its first statement (`KeywordInputs`); this statement runs
    for v1's every-term check and for a direct call of the keyword leg."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {_LEXEMES_SQL}", [text])
        return list(cursor.fetchone()[0])


@dataclass(frozen=True)
class KeywordInputs:
    """What the BM25 leg needs besides its scan: the query's lexemes and N, the scope's memories
    (`scope_memories`). search_memories reads both with its first statement."""
    lexemes: list[str]
    scope_rows: int


def _keyword_sql(where: str, tsquery_sql: str, *, all_terms_sql: str, score_sql: str, limit: int,
                 bm25_lexemes: int | None = None) -> str:
    if bm25_lexemes is not None and bm25_lexemes > BM25_INLINE_MAX_LEXEMES:
        return _bm25_unnest_sql(where, tsquery_sql, all_terms_sql=all_terms_sql, limit=limit)
    if bm25_lexemes is not None:
        return _bm25_keyword_sql(where, tsquery_sql, all_terms_sql=all_terms_sql, lexemes=bm25_lexemes, limit=limit)
    # The tsquery is written inline (not in a CTE) so the planner folds it to a constant and can
    # estimate its selectivity: a common word makes it scan the stack's rows through the stack
    # B-tree instead of walking the table-wide GIN posting lists of every stack. The inner LIMIT
    # caps how many matching rows get a ts_rank (and lets the scan stop there); `matched` says
    # whether the cap was reached.
    return f"""
        WITH matched AS MATERIALIZED (
                 SELECT {_LEG_COLUMNS}, m.search_vector, {all_terms_sql} AS all_terms
                   FROM memories_memory m
                  WHERE {where} AND numnode({tsquery_sql}) > 0 AND m.search_vector @@ {tsquery_sql}
                  LIMIT %(cap)s)
        SELECT {_LEG_COLUMNS.replace("m.", "h.")}, h.all_terms, {score_sql} AS score,
               count(*) OVER () AS matched
          FROM matched h
         ORDER BY h.all_terms DESC, score DESC, h.id
         LIMIT {int(limit)}
    """  # noqa: S608 - only fixed clauses are interpolated; values are parameters


def _keyword_leg(query: SearchQuery, stack_ids: Sequence[int], fetch: int,
                 audience: Audience | None = None, inputs: KeywordInputs | None = None) -> list[tuple[Any, ...]]:
    """Full-text candidates, ranked in two tiers, from ONE scan of the scope.

    1. Memories containing every term (websearch_to_tsquery: AND, quotes, -exclusions, or),
       ranked by ts_rank against that query.
    2. Only for plain-word queries: memories containing some of the terms (the AND relaxed to
       OR), so a question like "when did Mel paint a sunrise" still finds text with some of its
       words. They rank after every tier-1 hit, by ts_rank against the relaxed query.

    Each tier ranks at most KEYWORD_RANK_CAP matching rows: a query whose terms occur in more
    rows than that is not selective, its keyword ranking carries little, and ranking them all
    would cost a ts_rank per row. The vector leg is unaffected.
    Both tiers come from ONE scan (tier 1 rarely fills the page for a natural-language question,
    so a second scan used to run on nearly every search). Only when that scan reached the cap
    before finding `fetch` tier-1 rows - tier-1 rows may lie beyond it - does tier 1 get its own
    scan, and the first scan supplies tier 2 - unless every term is common in the table (see
    `_strict_scan_is_cheap`): then tier 1 is ranked within the capped sample, like tier 2.

    `inputs`: BM25's lexemes and N, read here when not given.
    """
    params: dict[str, Any] = {"stack_ids": list(stack_ids), "q": query.text, "cap": KEYWORD_RANK_CAP}
    where = _filters(query, params, audience)
    bm25 = "bm25" in ranking_features(query)
    lexemes: list[str] = []
    below_cap = False
    if bm25:
        if inputs is None:
            inputs = KeywordInputs(lexemes=_query_lexemes(query.text), scope_rows=scope_memories(stack_ids))
        lexemes = inputs.lexemes
        if not lexemes:  # only stop words (or nothing a tsquery keeps): no row can match
            return []
        params.update(_bm25_params(lexemes))
        params["scope_rows"] = inputs.scope_rows
        # BM25 reads the every-term flag only when the scan reached the cap (below), which a scope
        # of fewer memories cannot: its rows skip the whole-query match (~0.6 µs a matched row, §7.5).
        below_cap = inputs.scope_rows < KEYWORD_RANK_CAP

    bm25_lexemes = len(lexemes) if bm25 else None
    strict = "websearch_to_tsquery('english', %(q)s)"
    plain = _is_plain(query.text)
    strict_sql = _keyword_sql(where, strict, all_terms_sql="true",
                              score_sql=f"ts_rank(h.search_vector, {strict}, 1)", limit=fetch,
                              bm25_lexemes=bm25_lexemes)
    if not plain:
        return [row[:-1] for row in _fetch_rows(strict_sql, params)]
    loose = f"replace({strict}::text, ' & ', ' | ')::tsquery"
    loose_sql = _keyword_sql(where, loose, all_terms_sql="false" if below_cap else f"(m.search_vector @@ {strict})",
                             score_sql=(f"CASE WHEN h.all_terms THEN ts_rank(h.search_vector, {strict}, 1) "
                                        f"ELSE ts_rank(h.search_vector, {loose}, 1) END"),
                             limit=fetch, bm25_lexemes=bm25_lexemes)
    rows = _fetch_rows(loose_sql, params)
    complete = not rows or int(rows[0][-1]) < KEYWORD_RANK_CAP
    first_tier = [row[:-1] for row in rows if row[_SCORE]]
    if bm25 and not complete and len(first_tier) < fetch and _strict_scan_is_cheap(lexemes):
        # BM25 ranks by score, not by tier: the every-term rows of a separate scan join the capped sample.
        seen = {row[0] for row in rows}
        extra = [row[:-1] for row in _fetch_rows(strict_sql, params) if row[0] not in seen]
        return sorted([row[:-1] for row in rows] + extra, key=lambda r: -float(r[_SCORE + 1]))[:fetch]
    if bm25 or complete or len(first_tier) >= fetch or not _strict_scan_is_cheap(_query_lexemes(query.text)):
        return [row[:-1] for row in rows]
    first_tier = [row[:-1] for row in _fetch_rows(strict_sql, params)]
    return (first_tier + [row[:-1] for row in rows if not row[_SCORE]])[:fetch]


# The tier-1 scan (every term) goes through the tsvector GIN, whose AND walks the posting lists
# from the rarest term on, skipping ahead in the others: its cost follows the rarest term's list.
# When even that term is in this many rows of the table, the scan costs tens of milliseconds at a
# million rows (measured 25 ms for six terms each in ~14% of 1M rows) - and a query made only of
# such common words is one whose keyword ranking carries little anyway.
STRICT_SCAN_MAX_POSTINGS = 20_000

# The term frequencies ANALYZE keeps for the tsvector column (most_common_elems), and the table's
# row estimate: what the planner itself knows, read without touching the table. They change only when
# the table is analysed (autovacuum: after ~10 % of it changed), so a process rereads them at most
# once a minute (`_term_stats`) instead of once per search (~0.9 ms a search on a large stack).
_TERM_STATS_SQL = """
    SELECT s.most_common_elems::text::text[], s.most_common_elem_freqs, greatest(c.reltuples, 0)
      FROM pg_class c
      LEFT JOIN pg_stats s ON s.schemaname = current_schema() AND s.tablename = 'memories_memory'
                          AND s.attname = 'search_vector'
     WHERE c.oid = 'memories_memory'::regclass
"""
_TERM_STATS_SECONDS = 60.0
_TERM_STATS: dict[str, tuple[float, dict[str, float], float]] = {}  # by database alias


def _term_stats() -> tuple[dict[str, float], float]:
    """(the share of rows holding each of the table's most common lexemes, the table's rows)."""
    cached = _TERM_STATS.get(connection.alias)
    if cached is None or time.monotonic() - cached[0] > _TERM_STATS_SECONDS:
        with connection.cursor() as cursor:
            cursor.execute(_TERM_STATS_SQL)
            lexemes, freqs, rows = cursor.fetchone()
        # most_common_elem_freqs ends with three summary numbers: zip stops at the last lexeme.
        cached = (time.monotonic(), dict(zip(lexemes or [], freqs or [], strict=False)), float(rows or 0))
        _TERM_STATS[connection.alias] = cached
    return cached[1], cached[2]


def _strict_scan_is_cheap(lexemes: Sequence[str]) -> bool:
    """Whether the query's rarest term is rare enough in the table for the tier-1 GIN scan to be
    cheap. A term ANALYZE did not list among the most common ones counts as rare."""
    freqs, table_rows = _term_stats()
    rarest_rows = min((freqs.get(lexeme, 0.0) for lexeme in lexemes), default=0.0) * table_rows
    return rarest_rows <= STRICT_SCAN_MAX_POSTINGS


def _fetch_rows(sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


# BM25's N (§7.5): the scope's memories, from the stacks' live-memory counters (`Stack.memory_count`,
# moved by the one write path with every write): a primary-key read per stack instead of counting the
# scope's rows. An idf moves little when N is off by a few; `greatest(N, df)` keeps it defined.
SCOPE_MEMORIES_SQL = f"SELECT coalesce(sum(memory_count), 0) FROM {Stack._meta.db_table} WHERE id = ANY(%s)"  # noqa: S608


def scope_memories(stack_ids: Sequence[int]) -> int:
    with connection.cursor() as cursor:
        cursor.execute(SCOPE_MEMORIES_SQL, [list(stack_ids)])
        return int(cursor.fetchone()[0])


def ranking_features(query: SearchQuery) -> frozenset[str]:
    return RANKINGS.get(query.ranking, RANKINGS[DEFAULT_RANKING])


def _vector_sql(query: SearchQuery, stack_ids: Sequence[int], vector: Vector, fetch: int, *,
                exact: bool, single_stack: bool = False, audience: Audience | None = None,
                also: Sequence[Any] = ()) -> tuple[str, dict[str, Any]]:
    params: dict[str, Any] = {
        "stack_ids": list(stack_ids), "v": vector_literal(vector), "fetch": fetch,
        "model": get_embedder().model_id,
    }
    where = _filters(query, params, audience)
    if single_stack:
        # `stack_id = <literal>` (not `= ANY(array)`), so the planner can prove the partial
        # index's predicate (memories.search.vector_indexes) and walk that stack's own graph.
        where = where.replace("m.stack_id = ANY(%(stack_ids)s)", f"m.stack_id = {int(stack_ids[0])}")
    # `+ 0` makes the sort key differ from the indexed expression, so the planner cannot walk the
    # (post-filtering) HNSW index and must rank every row of the scope: exact, never short.
    order = "(m.embedding <=> %(v)s::vector) + 0" if exact else "m.embedding <=> %(v)s::vector"
    if exact and also:
        return _exact_with_also_sql(where, len(also)), {**params, "also": uuid_array(also)}
    sql = f"""
        SELECT {_LEG_COLUMNS}, 1 - (m.embedding <=> %(v)s::vector) AS similarity
          FROM memories_memory m
         WHERE {where} AND m.embedding IS NOT NULL AND m.embedding_model = %(model)s
         ORDER BY {order}
         LIMIT %(fetch)s
    """  # noqa: S608 — only fixed clauses are interpolated; values are parameters
    return sql, params


def _exact_with_also_sql(where: str, also: int) -> str:
    """The exact plan's statement that also hands back the cosine of the `also` (a count)
    memories `%(also)s` names - score fusion's keyword candidates (§7.5 "Cost"). An exact ranking
    computes the distance of every row in scope anyway, so the candidates' cosines come from the
    same scan: no primary-key lookups (on a large table, mostly cold index pages) and no second
    statement. The candidates sort first, so one top-N sort of `fetch` + `also` rows returns all of
    them and the `fetch` nearest of the rest; `_split_exact_with_also` takes the leg's `fetch`
    nearest from both. Only rows of the scope that pass the leg's filters can answer. OFFSET 0
    keeps the planner from substituting the distance expression into the sort key and the
    similarity, so it is computed once per row, not twice."""
    return f"""
        SELECT d.*, 1 - d.distance AS similarity
          FROM (SELECT {_LEG_COLUMNS}, m.embedding <=> %(v)s::vector AS distance
                  FROM memories_memory m
                 WHERE {where} AND m.embedding IS NOT NULL AND m.embedding_model = %(model)s
                OFFSET 0) d
         ORDER BY CASE WHEN d.id = ANY(%(also)s::uuid[]) THEN -1 ELSE d.distance END
         LIMIT %(fetch)s + {int(also)}
    """  # noqa: S608 - only fixed clauses are interpolated; values are parameters


def _split_exact_with_also(rows: Sequence[Sequence[Any]], fetch: int, also: Sequence[Any],
                           similarities: dict[Any, float]) -> list[tuple[Any, ...]]:
    """`_exact_with_also_sql`'s rows as the leg's `fetch` nearest (the leg's column shape: the
    similarity at _SCORE) plus the keyword candidates' cosine in `similarities`."""
    wanted = set(also)
    for row in rows:  # row: _LEG_COLUMNS, distance, similarity
        if row[0] in wanted:
            similarities[row[0]] = float(row[_SCORE + 1])
    nearest = sorted(rows, key=lambda row: row[_SCORE])[:fetch]
    return [(*row[:_SCORE], row[_SCORE + 1]) for row in nearest]


def stack_index_ef_search(fetch: int) -> int:
    """The walk width for a stack's own HNSW index when `fetch` rows are wanted (see _vector_leg)."""
    return min(HNSW_MAX_EF_SEARCH, max(fetch * 8, STACK_INDEX_MIN_EF_SEARCH))


# The cosine of memories another leg found (score fusion, §7.5), sent with an index walk's own
# statement so it costs no round trip of its own; the keyword leg already admitted these rows. (The
# exact plan reads them in its own scan instead: `_exact_with_also_sql`.)
_ALSO_SIMILARITIES_SQL = """
    SELECT id, 1 - (embedding <=> %(v)s::vector) FROM memories_memory
     WHERE id = ANY(%(also)s::uuid[]) AND embedding IS NOT NULL AND embedding_model = %(model)s"""


def _leg_rows(cursor: Any, sql: str, params: dict[str, Any], also: Sequence[Any],
              similarities: dict[Any, float] | None) -> list[tuple[Any, ...]]:
    """Run the vector leg's statement and, in the same round trip, read the cosine of `also` into
    `similarities` (two statements in one execute: the connection binds parameters client-side)."""
    if not also or similarities is None:
        cursor.execute(sql, params)
        return list(cursor.fetchall())
    cursor.execute(f"{sql};{_ALSO_SIMILARITIES_SQL}", {**params, "also": uuid_array(also)})
    rows = list(cursor.fetchall())
    cursor.nextset()
    similarities.update((row[0], float(row[1])) for row in cursor.fetchall())
    return rows


def _vector_leg(query: SearchQuery, stack_ids: Sequence[int], vector: Vector, fetch: int,
                stats: dict[str, Any], audience: Audience | None = None,
                depth: int = 0, *, also: Sequence[Any] = (),
                similarities: dict[Any, float] | None = None) -> tuple[list[tuple[Any, ...]], str]:
    """`fetch` rows are needed and size the HNSW walk; up to `depth` (≥ fetch) are returned when the
    walk or the exact ranking yields them, so a deeper list never widens the walk. The cosine of
    the memories `also` names (the keyword leg's candidates) goes into `similarities`."""
    wanted = fetch
    fetch = max(fetch, depth)
    if len(stack_ids) == 1 and stack_ids[0] in stacks_with_vector_index():
        # The stack's own partial HNSW index: no other stack's rows in the graph, no post-filter loss.
        # It exists because the stack passed STACK_INDEX_MIN_ROWS; a stack that has since shrunk
        # walks a small graph, comes up short and is ranked exactly below.
        # On the bench's clustered MiniLM vectors (100k-row stack, m 24 / ef_construction 200),
        # ef 200 gave recall@10 0.955, ef 300 0.97 and ef 400 0.977; the walk grows about linearly
        # with ef (~20 ms at 300 on a busy box), so ef 240 (= 8x a default over-fetch of 30) is
        # where recall stays above 0.95 without paying for more width (vector_indexes.py).
        ef = stack_index_ef_search(wanted)
        sql, params = _vector_sql(query, stack_ids, vector, fetch, exact=False, single_stack=True,
                                  audience=audience)
        # SET LOCAL needs a transaction; inside search's own one no savepoint is needed (an error
        # fails the whole search anyway, and a leftover ef_search affects no later query of it).
        with transaction.atomic(savepoint=False), connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL hnsw.ef_search = {int(ef)}")
            rows = _leg_rows(cursor, sql, params, also, similarities)
        stats["ef_search"] = ef
        if len(rows) >= wanted:
            return rows, "hnsw-stack"
        method = "hnsw-stack+exact"
    else:
        # Every other scope - a stack without its own index, several stacks of a school - is ranked
        # exactly: there is no table-wide vector index to walk (docs/algorithms.md §7.3 says why).
        method = "exact"
    if similarities is not None:
        # Rows an index walk already read the cosine of are not asked again.
        unread = [memory_id for memory_id in also if memory_id not in similarities]
        if unread:
            sql, params = _vector_sql(query, stack_ids, vector, fetch, exact=True, audience=audience, also=unread)
            return _split_exact_with_also(_fetch_rows(sql, params), fetch, unread, similarities), method
    sql, params = _vector_sql(query, stack_ids, vector, fetch, exact=True, audience=audience)
    with connection.cursor() as cursor:
        return _leg_rows(cursor, sql, params, (), None), method


@cache
def _embedding_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=2, thread_name_prefix="query-embed")


def _timed_embed(text: str) -> tuple[Vector, float]:
    started = time.perf_counter()
    vector = embed_query(text)
    return vector, round((time.perf_counter() - started) * 1000, 2)


def search_memories(*, stack_ids: Sequence[int], query: SearchQuery, now: datetime | None = None,
                    audience: Audience | None = None) -> SearchResult:
    """Hybrid search over the given stacks. The caller has already decided the caller may read
    every one of `stack_ids` (stacks.selectors); this function never widens that scope.
    `audience`: the requester when it is not the stacks' own credentials (memories.privacy.grants.audience_for);
    None searches everything in scope (the stack's own agent, a system job)."""
    started = time.perf_counter()
    now = now or timezone.now()
    stats: dict[str, Any] = {}
    if not stack_ids or not query.text.strip():
        return SearchResult(hits=[], method="none", legs={"keyword": SKIPPED_NOTHING_TO_SEARCH,
                                                          "semantic": SKIPPED_NOTHING_TO_SEARCH})
    fetch = over_fetch(query.limit)
    # Kernle's client gives up after 3 s and searches locally; a query that cannot finish well
    # inside that is cancelled (-> 503, which also makes the client fall back). Several stacks are
    # a school key's search (never the kernle client's), ranked exactly over all their rows (§7.3).
    timeout_ms = STATEMENT_TIMEOUT_MS if len(stack_ids) == 1 else SCHOOL_STATEMENT_TIMEOUT_MS
    inputs = None
    with transaction.atomic():
        with connection.cursor() as cursor:
            # The first statement sets the timeout (set_config(..., true) is SET LOCAL) and reads the
            # deployment's embedding model; what the BM25 leg needs besides its scan - the query's
            # lexemes and N - rides on it too: no round trip of their own.
            first = f"SELECT set_config('statement_timeout', %s, true), ({DEPLOYMENT_MODEL_SQL})"
            if "bm25" in ranking_features(query):
                cursor.execute(f"{first}, {_LEXEMES_SQL}, ({SCOPE_MEMORIES_SQL})",
                               [f"{int(timeout_ms)}ms", query.text, list(stack_ids)])
                _, stored_model, lexemes, scope_rows = cursor.fetchone()
                inputs = KeywordInputs(lexemes=list(lexemes), scope_rows=int(scope_rows))
            else:
                cursor.execute(first, [f"{int(timeout_ms)}ms"])
                _, stored_model = cursor.fetchone()
        result = _search(stack_ids=stack_ids, query=query, now=now, fetch=fetch, stats=stats, started=started,
                         audience=audience, stored_model=stored_model, inputs=inputs)
    SEARCH_LATENCY.observe(time.perf_counter() - started)
    return result


def _search(*, stack_ids: Sequence[int], query: SearchQuery, now: datetime, fetch: int, stats: dict[str, Any],
            started: float, audience: Audience | None, stored_model: str | None,
            inputs: KeywordInputs | None = None) -> SearchResult:
    """`stored_model`: the deployment's embedding model (memories.search.embedding_model), None
    before anything was embedded."""
    # A query vector is only comparable with stored vectors of its own model: when this process
    # embeds with another model than the deployment's, the semantic leg is skipped, and says so.
    try:
        query_model = get_embedder().model_id
    except ServiceUnavailable:  # e.g. EMBEDDING_PROVIDER=openai without EMBEDDING_API_URL
        query_model = ""
    if not query_model:
        semantic_skipped: str | None = SKIPPED_EMBEDDER_UNAVAILABLE
    elif stored_model is not None and stored_model != query_model:
        semantic_skipped = skipped_model_mismatch(query_model=query_model, stored_model=stored_model)
    else:
        semantic_skipped = None
    # The query embedding (CPU, torch releases the GIL) runs while the keyword leg waits on the
    # database, so a search costs max(embed, keyword) + vector rather than their sum.
    clock = time.perf_counter()
    pending = None if semantic_skipped else _embedding_pool().submit(_timed_embed, query.text)
    depth = fetch
    fusion = "score_fusion" in ranking_features(query)
    if fusion:
        # Score fusion may read deeper lists (§7.5). At FUSION_DEPTH = 30 `fetch` (>= 30) already
        # covers it; the knob stays for the grid. The keyword leg scores every matching row (up to
        # KEYWORD_RANK_CAP) whatever its LIMIT, and the vector leg's walk stays sized by `fetch`,
        # so extra rows would cost only their transfer.
        depth = max(fetch, min(FUSION_DEPTH, MAX_LIMIT))
    keyword_rows = _keyword_leg(query, stack_ids, depth, audience, inputs)
    similarities: dict[Any, float] = {}  # score fusion: the cosine of every keyword candidate
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
            vector_rows, method = _vector_leg(query, stack_ids, vector, fetch, stats, audience, depth,
                                              also=[row[0] for row in keyword_rows] if fusion else (),
                                              similarities=similarities)
            stats["vector_ms"] = round((time.perf_counter() - clock) * 1000, 2)
            if not vector_rows:
                semantic_skipped = _why_no_vectors(query, stack_ids, query_model, audience)
    if query.min_similarity > 0:  # 0 means "no threshold" (cosine itself can be negative)
        vector_rows = [row for row in vector_rows if float(row[_SCORE]) >= query.min_similarity]

    candidates: dict[Any, dict[str, Any]] = {}
    best_keyword = max((float(row[_SCORE + 1]) for row in keyword_rows), default=0.0) or 1.0
    for rank, row in enumerate(keyword_rows):
        entry = candidates.setdefault(row[0], {"row": row})
        entry["keyword_rank"] = rank
        entry["keyword_score"] = min(1.0, float(row[_SCORE + 1]) / best_keyword)
    for rank, row in enumerate(vector_rows):
        entry = candidates.setdefault(row[0], {"row": row})
        entry["semantic_rank"] = rank
        entry["semantic_score"] = min(1.0, max(0.0, float(row[_SCORE])))
        entry["similarity"] = float(row[_SCORE])

    scored: list[tuple[float, Any, dict[str, Any]]] = []
    features = ranking_features(query)
    if "score_fusion" in features and vector_rows:
        # A keyword hit the vector leg did not reach still has a cosine: the vector leg's statement
        # read it (by primary key, rows the keyword leg already admitted), so the fusion does not
        # count it as 0.
        for memory_id, entry in candidates.items():
            if "similarity" not in entry and memory_id in similarities:
                entry["similarity"] = similarities[memory_id]
    semantic_floor, semantic_span = _semantic_range([e["similarity"] for e in candidates.values() if "similarity" in e])
    for memory_id, entry in candidates.items():
        if "score_fusion" in features:
            fused = _score_fusion(entry, semantic_floor, semantic_span)
        else:
            fused = sum(1.0 / (RRF_K + entry[leg]) for leg in ("keyword_rank", "semantic_rank") if leg in entry)
        retention, weight = _retention_and_weight(entry["row"], now)
        combined = min(1.0, fused * weight / (2.0 / RRF_K))
        entry.update(fused=fused, retention=retention, weight=weight)
        scored.append((combined, memory_id, entry))
    scored.sort(key=lambda item: (-item[0], str(item[1])))
    page: dict[Any, Sequence[Any]] = {}  # rows of memories that may make the page, read with the context
    if "context" in ranking_features(query) and _is_plain(query.text):
        # Only for plain words: quotes, `or` and -exclusions ask for exactly the matching memories.
        scored = _lend_context(scored, candidates, query, stack_ids, now, audience, stats, page)
    top = scored[: query.limit]

    memories = {memory.pk: memory for memory in memories_from_rows([page[i] for _, i, _ in top if i in page])}
    unread = [memory_id for _, memory_id, _ in top if memory_id not in memories]
    if unread:  # no context (v1, or quotes/or/-exclusions): the page is read here
        memories.update(Memory.objects.defer("embedding", "search_vector").in_bulk(unread))
    hits = [
        SearchHit(
            memory=memories[memory_id],
            combined_score=round(combined, 6),
            fused_score=entry["fused"],
            keyword_score=entry.get("keyword_score"),
            semantic_score=entry.get("semantic_score"),
            keyword_rank=entry.get("keyword_rank"),
            semantic_rank=entry.get("semantic_rank"),
            retention=entry["retention"],
            weight=entry["weight"],
            boosts=entry.get("boosts", {}),
            context_of=entry.get("context_of"),
        )
        for combined, memory_id, entry in top
        if memory_id in memories  # deleted between the legs and this read: skip, don't fail
    ]
    stats.update(keyword_candidates=len(keyword_rows), semantic_candidates=len(vector_rows))
    return SearchResult(
        hits=hits,
        method=method,
        took_ms=(time.perf_counter() - started) * 1000,
        embedding_model=query_model,
        stats=stats,
        legs={"keyword": LEG_RAN, "semantic": semantic_skipped or LEG_RAN},
    )


# Neighbouring-turn context (memories.search.context, docs/algorithms.md §7.5): the best
# CONTEXT_SEEDS hits each lend CONTEXT_SHARE of their combined score to the memory just before and
# just after them in the same session, and half that to the turns two away. Chosen on the LoCoMo dev
# split (see §7.5 for the grid). 5 seeds, not 10: the same recall@10, and the neighbour statement
# makes half the index scans (issue 20's latency budget, §7.5).
CONTEXT_SEEDS = 5
CONTEXT_SHARE = 0.3
CONTEXT_WINDOW = 2  # turns on each side
CONTEXT_DECAY = 0.5  # the share's factor per further turn: the second turn away gets half


# Score fusion (§7.5): each leg's score scaled to [0, 1] within this search - BM25 by the best
# keyword hit, the cosine min-max over the vector leg's candidates - then mixed with KEYWORD_WEIGHT,
# and put on RRF's scale (a hit first in both legs gets 2/RRF_K) so `combined` reads as before.
# FUSION_DEPTH: candidates per leg. 30 (= v1's over-fetch at limit 10) kept the dev split's recall of
# 50 and costs less per leg (§7.5).
KEYWORD_WEIGHT = 0.4
FUSION_DEPTH = 30


def _semantic_range(sims: Sequence[float]) -> tuple[float, float]:
    if not sims:
        return 0.0, 1.0
    low, high = min(sims), max(sims)
    if high - low < 1e-9:  # one candidate, or all alike: each is the best the leg found
        return high - 1.0, 1.0
    return low, high - low


def _score_fusion(entry: dict[str, Any], semantic_floor: float, semantic_span: float) -> float:
    keyword = entry.get("keyword_score") or 0.0
    semantic = 0.0
    if "similarity" in entry:
        semantic = min(1.0, max(0.0, (entry["similarity"] - semantic_floor) / semantic_span))
    return (2.0 / RRF_K) * (KEYWORD_WEIGHT * keyword + (1 - KEYWORD_WEIGHT) * semantic)


def _lend_context(scored: list[tuple[float, Any, dict[str, Any]]], candidates: dict[Any, dict[str, Any]],
                  query: SearchQuery, stack_ids: Sequence[int], now: datetime, audience: Audience | None,
                  stats: dict[str, Any], page: dict[Any, Sequence[Any]]) -> list[tuple[float, Any, dict[str, Any]]]:
    """Lend the best hits' context (see CONTEXT_SHARE), and read the row of every hit that can still
    make the page - the page before context, or a neighbour - into `page` (by id), in the same
    statement as the neighbours: context only raises scores, so a hit below the page without a
    share of its own stays below it."""
    clock = time.perf_counter()
    seeds = {memory_id: combined for combined, memory_id, _ in scored[:CONTEXT_SEEDS]}
    seed_rank = {memory_id: rank for rank, memory_id in enumerate(seeds)}
    params: dict[str, Any] = {"stack_ids": list(stack_ids)}
    where = _filters(query, params, audience)
    rows = neighbour_rows(seeds=list(seeds), where=where, params=params, window=CONTEXT_WINDOW,
                          also=[memory_id for _, memory_id, _ in scored[:query.limit]])
    lent: dict[Any, tuple[float, Any]] = {}
    neighbour: dict[Any, tuple[Any, ...]] = {}
    for seed_id, distance, *values in rows:  # in no particular order
        page[values[0]] = values
        if seed_id is None:
            continue
        share = CONTEXT_SHARE * CONTEXT_DECAY ** (int(distance) - 1) * seeds[seed_id]
        best, best_seed = lent.get(values[0], (0.0, None))
        # The largest share; between equal shares, the better-ranked seed's (whatever the row order).
        if share > best or (share == best and best_seed is not None and seed_rank[seed_id] < seed_rank[best_seed]):
            lent[values[0]] = (share, seed_id)
            neighbour[values[0]] = tuple(values[i] for i in _LEG_FIELD_INDEXES)
    by_id = {memory_id: (combined, entry) for combined, memory_id, entry in scored}
    for memory_id, (share, seed_id) in lent.items():
        if memory_id in by_id:
            combined, entry = by_id[memory_id]
        else:  # found by neither leg: only its neighbour's share puts it in the ranking
            combined, entry = 0.0, candidates.setdefault(memory_id, {"row": neighbour[memory_id]})
            retention, weight = _retention_and_weight(neighbour[memory_id], now)
            entry.update(fused=0.0, retention=retention, weight=weight)
        entry["boosts"] = {"context": round(share, 6)}
        entry["context_of"] = seed_id
        by_id[memory_id] = (min(1.0, combined + share), entry)
    stats["context_ms"] = round((time.perf_counter() - clock) * 1000, 2)
    return sorted(((c, i, e) for i, (c, e) in by_id.items()), key=lambda item: (-item[0], str(item[1])))


def _retention_and_weight(row: Sequence[Any], now: datetime) -> tuple[float, float]:
    """A leg row's retrievability and ranking weight (§7.2)."""
    (_, stability, confidence, created_at, last_reviewed_at, kind, times_accessed, valence, arousal) = row[:_SCORE]
    retention = memory_retrievability(DecayState(
        kind=kind, confidence=float(confidence), times_accessed=int(times_accessed),
        emotional_valence=float(valence), emotional_arousal=float(arousal), stability=float(stability),
        last_reviewed_at=last_reviewed_at, created_at=created_at), now)
    return retention, ranking_weight(retention=retention, confidence=float(confidence),
                                     age_days=(now - created_at).total_seconds() / 86400)


def _why_no_vectors(query: SearchQuery, stack_ids: Sequence[int], query_model: str,
                    audience: Audience | None = None) -> str | None:
    """Why the vector leg found no row of `query_model` in scope, or None when the scope (with its
    filters) is simply empty. Runs only after an empty vector leg, so it costs nothing otherwise:
    either the scope's vectors are of another model (a switch or a heal still under way), or none
    of its memories has been embedded yet (the embedding backlog)."""
    params: dict[str, Any] = {"stack_ids": list(stack_ids), "model": query_model}
    where = _filters(query, params, audience)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT m.embedding_model FROM memories_memory m WHERE {where} "  # noqa: S608 - fixed clauses
                       f"AND m.embedding IS NOT NULL AND m.embedding_model <> %(model)s LIMIT 1", params)
        other = cursor.fetchone()
        if other is not None:
            return skipped_model_mismatch(query_model=query_model, stored_model=other[0])
        cursor.execute(f"SELECT 1 FROM memories_memory m WHERE {where} LIMIT 1", params)  # noqa: S608
        return SKIPPED_NOT_EMBEDDED_YET if cursor.fetchone() is not None else None
