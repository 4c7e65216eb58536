"""The vector leg of hybrid search: pgvector cosine over the deployment's model (docs/algorithms.md §7.1, §7.3).

Method names in brackets are what `SearchResult.method` reports. A stack with its own partial
HNSW index (memories.search.vector_indexes) is walked through that graph [hnsw-stack], and ranked
exactly instead whenever the walk yields too few rows [hnsw-stack+exact], so a search returns k
hits whenever k exist. Every other scope - a smaller stack, or several stacks of a school - is
ranked exactly (the stack-leading B-tree, then a sort of the scope's rows) [exact]. There is no
table-wide vector index: pgvector filters a shared graph's results after the walk, so it served
one stack poorly, and keeping it up to date was most of the database's work under load (§7.3).

Rows have the shape memories.search.query.LEG_COLUMNS + the cosine. The leg also hands back the
cosine of the keyword leg's candidates, for score fusion (§7.5), without a round trip of its own.
The query is embedded on a small pool (`embed_in_background`) while the keyword leg runs.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cache
from typing import Any

from django.db import connection

from memories.privacy.grants import Audience
from memories.search.embeddings import Vector, embed_query, get_embedder, vector_literal
from memories.search.query import (
    LEG_COLUMNS,
    SCORE,
    SKIPPED_NOT_EMBEDDED_YET,
    SearchQuery,
    execute_under_deadline,
    fetch_rows,
    scope_filters,
    skipped_model_mismatch,
)
from memories.search.vector_indexes import stacks_with_vector_index
from memoryhub.database import uuid_array

HNSW_MAX_EF_SEARCH = 1000  # pgvector's upper bound for hnsw.ef_search
STACK_INDEX_MIN_EF_SEARCH = 240  # a per-stack index's walk width (see vector_leg)


@cache
def pgvector_version() -> tuple[int, ...]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        row = cursor.fetchone()
    return tuple(int(p) for p in re.findall(r"\d+", row[0] if row else "0"))


def vector_sql(query: SearchQuery, stack_ids: Sequence[int], vector: Vector, fetch: int, *,
               exact: bool, single_stack: bool = False, audience: Audience | None = None,
               also: Sequence[Any] = ()) -> tuple[str, dict[str, Any]]:
    params: dict[str, Any] = {
        "stack_ids": list(stack_ids), "v": vector_literal(vector), "fetch": fetch,
        "model": get_embedder().model_id,
    }
    where = scope_filters(query, params, audience)
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
        SELECT {LEG_COLUMNS}, 1 - (m.embedding <=> %(v)s::vector) AS similarity
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
          FROM (SELECT {LEG_COLUMNS}, m.embedding <=> %(v)s::vector AS distance
                  FROM memories_memory m
                 WHERE {where} AND m.embedding IS NOT NULL AND m.embedding_model = %(model)s
                OFFSET 0) d
         ORDER BY CASE WHEN d.id = ANY(%(also)s::uuid[]) THEN -1 ELSE d.distance END
         LIMIT %(fetch)s + {int(also)}
    """  # noqa: S608 - only fixed clauses are interpolated; values are parameters


def _split_exact_with_also(rows: Sequence[Sequence[Any]], fetch: int, also: Sequence[Any],
                           similarities: dict[Any, float]) -> list[tuple[Any, ...]]:
    """`_exact_with_also_sql`'s rows as the leg's `fetch` nearest (the leg's column shape: the
    similarity at SCORE) plus the keyword candidates' cosine in `similarities`."""
    wanted = set(also)
    for row in rows:  # row: LEG_COLUMNS, distance, similarity
        if row[0] in wanted:
            similarities[row[0]] = float(row[SCORE + 1])
    nearest = sorted(rows, key=lambda row: row[SCORE])[:fetch]
    return [(*row[:SCORE], row[SCORE + 1]) for row in nearest]


def stack_index_ef_search(fetch: int) -> int:
    """The walk width for a stack's own HNSW index when `fetch` rows are wanted (see vector_leg)."""
    return min(HNSW_MAX_EF_SEARCH, max(fetch * 8, STACK_INDEX_MIN_EF_SEARCH))


# The cosine of memories another leg found (score fusion, §7.5), sent with an index walk's own
# statement so it costs no round trip of its own; the keyword leg already admitted these rows. (The
# exact plan reads them in its own scan instead: `_exact_with_also_sql`.)
_ALSO_SIMILARITIES_SQL = """
    SELECT id, 1 - (embedding <=> %(v)s::vector) FROM memories_memory
     WHERE id = ANY(%(also)s::uuid[]) AND embedding IS NOT NULL AND embedding_model = %(model)s"""


def _leg_rows(cursor: Any, sql: str, params: dict[str, Any], also: Sequence[Any],
              similarities: dict[Any, float] | None, *, settings_sql: str = "") -> list[tuple[Any, ...]]:
    """Run the vector leg's statement and, in the same round trip, read the cosine of `also` into
    `similarities` (two statements in one execute: the connection binds parameters client-side)."""
    if not also or similarities is None:
        execute_under_deadline(cursor, sql, params, settings_sql=settings_sql)
        return list(cursor.fetchall())
    execute_under_deadline(cursor, f"{sql};{_ALSO_SIMILARITIES_SQL}", {**params, "also": uuid_array(also)},
                           settings_sql=settings_sql)
    rows = list(cursor.fetchall())
    cursor.nextset()
    similarities.update((row[0], float(row[1])) for row in cursor.fetchall())
    return rows


def vector_leg(query: SearchQuery, stack_ids: Sequence[int], vector: Vector, fetch: int,
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
        # The walk grows about linearly with ef, and ef 240 (= 8x a default over-fetch of 30) is
        # where recall on the bench's clustered MiniLM vectors stays above 0.95 without paying for
        # more width (docs/algorithms.md §7.3 has the figures).
        ef = stack_index_ef_search(wanted)
        sql, params = vector_sql(query, stack_ids, vector, fetch, exact=False, single_stack=True,
                                  audience=audience)
        # In the statement's own query string: SET LOCAL lasts until its statements end.
        with connection.cursor() as cursor:
            rows = _leg_rows(cursor, sql, params, also, similarities,
                             settings_sql=f"SET LOCAL hnsw.ef_search = {int(ef)}; ")
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
            sql, params = vector_sql(query, stack_ids, vector, fetch, exact=True, audience=audience, also=unread)
            return _split_exact_with_also(fetch_rows(sql, params), fetch, unread, similarities), method
    sql, params = vector_sql(query, stack_ids, vector, fetch, exact=True, audience=audience)
    with connection.cursor() as cursor:
        return _leg_rows(cursor, sql, params, (), None), method


@cache
def _embedding_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=2, thread_name_prefix="query-embed")


def _timed_embed(text: str) -> tuple[Vector, float]:
    started = time.perf_counter()
    vector = embed_query(text)
    return vector, round((time.perf_counter() - started) * 1000, 2)


def embed_in_background(text: str) -> Future[tuple[Vector, float]]:
    """The query's vector and the milliseconds its embedding took, computed on a small pool (CPU;
    torch releases the GIL) so the caller's keyword leg waits on the database meanwhile."""
    return _embedding_pool().submit(_timed_embed, text)


def why_no_vectors(query: SearchQuery, stack_ids: Sequence[int], query_model: str,
                   audience: Audience | None = None) -> str | None:
    """Why the vector leg found no row of `query_model` in scope, or None when the scope (with its
    filters) is simply empty. Runs only after an empty vector leg, so it costs nothing otherwise:
    either the scope's vectors are of another model (a switch or a heal still under way), or none
    of its memories has been embedded yet (the embedding backlog)."""
    params: dict[str, Any] = {"stack_ids": list(stack_ids), "model": query_model}
    where = scope_filters(query, params, audience)
    with connection.cursor() as cursor:
        execute_under_deadline(cursor, f"SELECT m.embedding_model FROM memories_memory m WHERE {where} "  # noqa: S608
                               f"AND m.embedding IS NOT NULL AND m.embedding_model <> %(model)s LIMIT 1", params)
        other = cursor.fetchone()
        if other is not None:
            return skipped_model_mismatch(query_model=query_model, stored_model=other[0])
        execute_under_deadline(cursor, f"SELECT 1 FROM memories_memory m WHERE {where} LIMIT 1", params)  # noqa: S608
        return SKIPPED_NOT_EMBEDDED_YET if cursor.fetchone() is not None else None
