"""The keyword leg of hybrid search: PostgreSQL full text, scored by BM25 (docs/algorithms.md §7.1, §7.5).

One scan of the scope finds every memory holding any query term (for plain words; websearch
syntax - quotes, `or`, -exclusions - keeps its strict meaning) and scores it by BM25, from the
tsvector itself: no copy of it per row, no set-returning function for a short query. Returns rows
of the shape memories.search.query.LEG_COLUMNS + the every-term flag + the score + the query's
weight (QUERY_WEIGHT), best first.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection

from memories.privacy.grants import Audience
from memories.search.query import (
    LEG_COLUMNS,
    SCORE,
    SearchQuery,
    execute_under_deadline,
    fetch_rows,
    is_plain,
    scope_filters,
)
from stacks.models import Stack

# The last column of the leg's rows: the query's weight - the BM25 of a memory of average length
# holding each query lexeme once (tf = 1, dl = avgdl: each adds exactly its idf), a lexeme no matched
# row holds counted at the mean idf of those some row holds (Σ found idf · lexemes / found lexemes).
# Fusion scales the leg's scores by it when the best hit scores less (memories.search.fusion.
# merge_candidates): a best hit that holds one word of a question whose other words the stack lacks
# is not a full keyword match (docs/algorithms.md §7.6).
QUERY_WEIGHT = SCORE + 2

# Each scan ranks at most this many matching rows: a query whose terms occur in more rows than
# that is not selective, and its keyword ranking carries little (docs/algorithms.md §7.1).
KEYWORD_RANK_CAP = 1_000

# BM25 (Robertson/Sparck Jones), the textbook constants: k1 = 1.2 saturates a term's repeats (a
# third "pizza" adds little), b = 0.75 normalises for length (a long memory matches more words by
# chance). The dev split gave no reason to move them (docs/algorithms.md §7.5).
BM25_K1 = 1.2
BM25_B = 0.75


def _bm25_keyword_sql(where: str, tsquery_sql: str, *, all_terms_sql: str, lexemes: int, limit: int,
                      scope_scan: bool = False) -> str:
    """The keyword leg scored by BM25 rather than ts_rank (docs/algorithms.md §7.5).

    tf = the lexeme's positions in the memory's tsvector, dl = the tsvector's length (distinct
    lexemes), avgdl = the mean over the matched rows, df = how many matched rows hold the lexeme and
    N = the scope's memories (%(scope_rows)s, see `keyword_leg`). The matched rows are every row of the scope holding
    any query term (the OR query), so df is exact unless the scan reached KEYWORD_RANK_CAP - then df
    counts within those rows, which only happens for terms common enough to carry little weight.

    Cost (§7.5 "Cost"): no set-returning function and no copy of the tsvector per matched row -
    unnesting each row's tsvector, or cutting it down to its query lexemes (setweight + ts_filter,
    then its text), cost more per row than the whole score below. Every query lexeme i is a parameter,
    %(term_<i>)s = a one-lexeme tsquery (`_bm25_params`); each matched row gets tf_<i> once, 0 when
    absent: presence is `@@` (a binary search in the row's sorted lexemes) and the count is read
    from ts_rank (`_tf_sql`). df and the score then read those columns, not the tsvector."""
    tfs = ", ".join(f"CASE WHEN m.search_vector @@ %(term_{i})s::tsquery THEN {_tf_sql(i)} ELSE 0 END AS tf_{i}"
                    for i in range(lexemes))
    df = ", ".join(f"count(*) FILTER (WHERE h.tf_{i} > 0) AS df_{i}" for i in range(lexemes))
    idfs = [f"ln(1 + (greatest(scope_rows, df_{i}) - df_{i} + 0.5::float8) / (df_{i} + 0.5::float8))"
            for i in range(lexemes)]
    idf = ", ".join(f"{expression} AS idf_{i}" for i, expression in enumerate(idfs))
    found = " + ".join(f"CASE WHEN df_{i} > 0 THEN {expression} ELSE 0 END" for i, expression in enumerate(idfs))
    present = " + ".join(f"CASE WHEN df_{i} > 0 THEN 1 ELSE 0 END" for i in range(lexemes))
    weight = f"({found}) * {lexemes} / greatest({present}, 1)"
    # tf·(k1+1)/(tf + norm), written as (k1+1) - (k1+1)·norm/(tf + norm) so tf is read once. An
    # absent lexeme (tf 0) adds exactly 0 without a CASE: norm ≥ k1·(1 - b) > 0 and x/x is exactly 1.
    score = " + ".join(f"s.idf_{i} * ({BM25_K1} + 1) * (1 - n.norm / (h.tf_{i} + n.norm))" for i in range(lexemes))
    return f"""
        WITH matched AS MATERIALIZED (
                 SELECT {LEG_COLUMNS}, {all_terms_sql} AS all_terms, length(m.search_vector)::float8 AS dl, {tfs}
                   FROM memories_memory m
                  WHERE {where} AND numnode({tsquery_sql}) > 0 AND {_matches(tsquery_sql, scope_scan)}
                  LIMIT %(cap)s),
             stats AS (SELECT greatest(avg(dl), 1) AS avgdl, count(*) AS matched,
                              %(scope_rows)s::bigint AS scope_rows, {df} FROM matched h),
             -- MATERIALIZED: computed once, not folded into every row's score.
             idf AS MATERIALIZED (SELECT avgdl, matched, scope_rows, {idf}, {weight} AS query_weight FROM stats)
        SELECT {LEG_COLUMNS.replace("m.", "h.")}, h.all_terms, ({score}) AS score, s.query_weight, s.matched
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
# matched rows' query lexemes costs to run (a pasted paragraph; §7.5 "Cost"); such a query is
# scored by the unnest form, which gives the same scores at a cost that follows the matched rows,
# not the terms.
BM25_INLINE_MAX_LEXEMES = 32


def _bm25_unnest_sql(where: str, tsquery_sql: str, *, all_terms_sql: str, limit: int, scope_scan: bool = False) -> str:
    """`_bm25_keyword_sql`'s scores, by unnesting each matched row's query lexemes (the long-query form)."""
    return f"""
        WITH matched AS MATERIALIZED (
                 SELECT {LEG_COLUMNS}, {all_terms_sql} AS all_terms, length(m.search_vector)::float8 AS dl,
                        ts_filter(setweight(m.search_vector, 'A', %(lexemes)s::text[]), '{{a}}') AS query_terms
                   FROM memories_memory m
                  WHERE {where} AND numnode({tsquery_sql}) > 0 AND {_matches(tsquery_sql, scope_scan)}
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
        SELECT {LEG_COLUMNS.replace("m.", "h.")}, h.all_terms, coalesce(b.score, 0) AS score,
               (SELECT coalesce(sum(idf), 0) * cardinality(%(lexemes)s::text[]) / greatest(count(*), 1) FROM idf)
                 AS query_weight, s.matched
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


LEXEMES_SQL = "tsvector_to_array(to_tsvector('english', %s))"


def query_lexemes(text: str) -> list[str]:
    """The query's distinct lexemes as the english configuration makes them (what search_vector
    holds). A search reads them with its first statement (`KeywordInputs`); this is the same read
    on its own."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {LEXEMES_SQL}", [text])
        return list(cursor.fetchone()[0])


@dataclass(frozen=True)
class KeywordInputs:
    """What the BM25 leg needs besides its scan: the query's lexemes and N, the scope's memories
    (SCOPE_MEMORIES_SQL). search_memories reads both with its first statement."""
    lexemes: list[str]
    scope_rows: int


def _matches(tsquery_sql: str, scope_scan: bool) -> str:
    """The scan's match condition. `scope_scan`: written as the function behind `@@`, which the
    planner cannot answer from the GIN index, so it reads the scope's own rows through the stack
    B-tree (`scope_scan_is_cheaper`; docs/algorithms.md §7.1 says how to undo it)."""
    return f"ts_match_vq(m.search_vector, {tsquery_sql})" if scope_scan else f"m.search_vector @@ {tsquery_sql}"


def _keyword_sql(where: str, tsquery_sql: str, *, all_terms_sql: str, limit: int, lexemes: int,
                 scope_scan: bool = False) -> str:
    """The leg's statement for a query of `lexemes` lexemes: the per-lexeme form, or the unnest
    form above BM25_INLINE_MAX_LEXEMES.

    The tsquery is written inline (not in a CTE) so the planner folds it to a constant and can
    estimate its selectivity: a common word makes it scan the stack's rows through the stack
    B-tree instead of walking the table-wide GIN posting lists of every stack. The inner LIMIT
    caps how many matching rows get a score (and lets the scan stop there); `matched` says
    whether the cap was reached. The planner's own choice between the two underrates the GIN walk
    when the terms are common in other stacks; `scope_scan` makes it for the OR scan
    (`scope_scan_is_cheaper`)."""
    if lexemes > BM25_INLINE_MAX_LEXEMES:
        return _bm25_unnest_sql(where, tsquery_sql, all_terms_sql=all_terms_sql, limit=limit, scope_scan=scope_scan)
    return _bm25_keyword_sql(where, tsquery_sql, all_terms_sql=all_terms_sql, lexemes=lexemes, limit=limit,
                             scope_scan=scope_scan)


def keyword_leg(query: SearchQuery, stack_ids: Sequence[int], fetch: int, audience: Audience | None,
                inputs: KeywordInputs) -> list[tuple[Any, ...]]:
    """Full-text candidates scored by BM25, best first, from ONE scan of the scope.

    The scan finds the memories containing every term (websearch_to_tsquery: AND, quotes,
    -exclusions, or) and, only for plain-word queries, those containing some of the terms (the AND
    relaxed to OR), so a question like "when did Mel paint a sunrise" still finds text with some
    of its words. BM25 ranks them all by score: it already favours rows with more of the rare
    terms, so there are no tiers.

    The scan scores at most KEYWORD_RANK_CAP matching rows. Only when it reached the cap before
    finding `fetch` rows with every term - such rows may lie beyond it - do those rows get a scan
    of their own, joining the capped sample - unless every term is common in the table (see
    `strict_scan_is_cheap`): then they are ranked within the capped sample.

    `inputs`: BM25's lexemes and N, which search_memories reads with its first statement.
    """
    params: dict[str, Any] = {"stack_ids": list(stack_ids), "q": query.text, "cap": KEYWORD_RANK_CAP}
    where = scope_filters(query, params, audience)
    lexemes = inputs.lexemes
    if not lexemes:  # only stop words (or nothing a tsquery keeps): no row can match
        return []
    params.update(_bm25_params(lexemes))
    params["scope_rows"] = inputs.scope_rows
    # BM25 reads the every-term flag only when the scan reached the cap (below), which a scope of
    # fewer memories cannot: its rows skip the whole-query match (§7.5 "Cost").
    below_cap = inputs.scope_rows < KEYWORD_RANK_CAP

    strict = "websearch_to_tsquery('english', %(q)s)"
    strict_sql = _keyword_sql(where, strict, all_terms_sql="true", limit=fetch, lexemes=len(lexemes))
    if not is_plain(query.text):
        return [row[:-1] for row in fetch_rows(strict_sql, params)]
    loose = f"replace({strict}::text, ' & ', ' | ')::tsquery"
    loose_sql = _keyword_sql(where, loose, all_terms_sql="false" if below_cap else f"(m.search_vector @@ {strict})",
                             limit=fetch, lexemes=len(lexemes),
                             scope_scan=scope_scan_is_cheaper(lexemes, inputs.scope_rows))
    rows = fetch_rows(loose_sql, params)
    complete = not rows or int(rows[0][-1]) < KEYWORD_RANK_CAP
    first_tier = [row[:-1] for row in rows if row[SCORE]]
    if not complete and len(first_tier) < fetch and strict_scan_is_cheap(lexemes):
        # Ranked by score, not by tier: the every-term rows of a separate scan join the capped sample.
        seen = {row[0] for row in rows}
        extra = [row[:-1] for row in fetch_rows(strict_sql, params) if row[0] not in seen]
        return sorted([row[:-1] for row in rows] + extra, key=lambda r: -float(r[SCORE + 1]))[:fetch]
    return [row[:-1] for row in rows]


# The every-term scan goes through the tsvector GIN, whose AND walks the posting lists
# from the rarest term on, skipping ahead in the others: its cost follows the rarest term's list.
# When even that term is in this many rows of the table, the scan costs tens of milliseconds on a
# large table (docs/algorithms.md §7.1) - and a query made only of such common words is one whose
# keyword ranking carries little anyway.
STRICT_SCAN_MAX_POSTINGS = 20_000

# The term frequencies ANALYZE keeps for the tsvector column (most_common_elems), and the table's rows:
# what the planner itself knows, read without touching the table. The rows are the larger of ANALYZE's
# estimate and the cumulative statistics' live-row count, which every committed insert and delete moves
# within about a second (a crash or a statistics reset sets it back to 0): a bulk import can grow the
# table tenfold long before ANALYZE runs, and scaling the frequencies by the rows ANALYZE saw would keep
# a walk of posting lists that have grown as much. A process rereads them at most every few seconds
# (`_term_stats`), not on every search (the read's cost: docs/algorithms.md §7.1).
_TERM_STATS_SQL = """
    SELECT s.most_common_elems::text::text[], s.most_common_elem_freqs,
           greatest(c.reltuples, pg_stat_get_live_tuples(c.oid), 0)
      FROM pg_class c
      LEFT JOIN pg_stats s ON s.schemaname = current_schema() AND s.tablename = 'memories_memory'
                          AND s.attname = 'search_vector'
     WHERE c.oid = 'memories_memory'::regclass
"""
_TERM_STATS_SECONDS = 2.0
_TERM_STATS: dict[str, tuple[float, dict[str, float], float]] = {}  # by database alias


def _term_stats() -> tuple[dict[str, float], float]:
    """(the share of rows holding each of the table's most common lexemes, the table's rows)."""
    cached = _TERM_STATS.get(connection.alias)
    if cached is None or time.monotonic() - cached[0] > _TERM_STATS_SECONDS:
        with connection.cursor() as cursor:
            execute_under_deadline(cursor, _TERM_STATS_SQL, None)
            lexemes, freqs, rows = cursor.fetchone()
        # most_common_elem_freqs ends with three summary numbers: zip stops at the last lexeme.
        cached = (time.monotonic(), dict(zip(lexemes or [], freqs or [], strict=False)), float(rows or 0))
        _TERM_STATS[connection.alias] = cached
    return cached[1], cached[2]


# Decoding one posting of the table-wide GIN into the scan's bitmap costs about a fifteenth of
# reading one of the scope's rows through the stack B-tree and testing its tsvector (docs/algorithms.md §7.1).
GIN_POSTING_COST_IN_ROWS = 1 / 15


def scope_scan_is_cheaper(lexemes: Sequence[str], scope_rows: int) -> bool:
    """Whether the OR scan should read the scope's own rows rather than walk the GIN posting lists
    of the query's terms. The walk decodes every posting of every term, in every stack, before the
    first row is read; the scope scan reads rows until KEYWORD_RANK_CAP of them match, so a term
    common across the table (long lists) makes it the cheaper one even in a large stack. From the
    table's statistics (`_term_stats`); a term ANALYZE did not list among the most common counts
    as rare, which keeps the GIN walk (docs/algorithms.md §7.1)."""
    freqs, table_rows = _term_stats()
    shares = [freqs.get(lexeme, 0.0) for lexeme in lexemes]
    postings = sum(shares) * table_rows
    missing = math.prod(1 - share for share in shares)  # the share of rows holding none of the terms
    rows_read = scope_rows if missing >= 1 else min(scope_rows, KEYWORD_RANK_CAP / (1 - missing))
    return rows_read < postings * GIN_POSTING_COST_IN_ROWS


def strict_scan_is_cheap(lexemes: Sequence[str]) -> bool:
    """Whether the query's rarest term is rare enough in the table for the every-term GIN scan to be
    cheap. A term ANALYZE did not list among the most common ones counts as rare."""
    freqs, table_rows = _term_stats()
    rarest_rows = min((freqs.get(lexeme, 0.0) for lexeme in lexemes), default=0.0) * table_rows
    return rarest_rows <= STRICT_SCAN_MAX_POSTINGS


# BM25's N (§7.5): the scope's memories, from the stacks' live-memory counters (`Stack.memory_count`,
# moved by the one write path with every write): a primary-key read per stack instead of counting the
# scope's rows. An idf moves little when N is off by a few; `greatest(N, df)` keeps it defined.
SCOPE_MEMORIES_SQL = f"SELECT coalesce(sum(memory_count), 0) FROM {Stack._meta.db_table} WHERE id = ANY(%s)"  # noqa: S608
