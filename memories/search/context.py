"""Neighbouring-turn context for search hits (docs/algorithms.md §7.5).

A conversation is stored one memory per turn, and what a question asks about often spans two
adjacent turns ("What did you paint?" / "A sunrise, last year"): the turn the query matches best
is next to the turn that holds the answer. So a strong hit lends a share of its score to the
memories just before and after it - the same stack, the same kind, the previous and next ones by
`created_at` (a window of turns on each side), each at most CONTEXT_MAX_GAP from the hit (a
longer pause ends the session, so context never crosses from one session into another, and never
from one stack into another).

The neighbours are read with the search's own WHERE clause (stack scope, deletion, forgetting,
expiry, privacy grants, filters), in one statement that walks the (stack, kind, created_at)
B-tree twice per seed (a few entries each way): a hidden or out-of-scope memory can never be lent a score.

The same statement also reads the rows of the search's page (`also`), so context costs the search
no round trip of its own. This module builds and runs that one statement; memories.search.fusion decides
the seeds and the share, and memories.search.query builds the WHERE clause.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.db import connection

from memories.models import Memory
from memories.search.query import deadline_sql, execute_under_deadline
from memories.selectors import MEMORY_ROWS
from memoryhub.database import uuid_array
from memoryhub.prepared import fetch_prepared

# A pause longer than this between two memories of a stack ends a conversation session. Chat turns
# are seconds to a few minutes apart; an agent that comes back after a quarter of an hour is in a
# new conversation, whose opening has nothing to do with the last words of the previous one.
CONTEXT_MAX_GAP = timedelta(minutes=15)
# The neighbour statements' prepared names start so (memoryhub.prepared).
PREPARED_NAME = "memoryhub_context"


def _neighbour_sql(where: str) -> str:
    """(seed_id, distance, id) of the `%(window)s` memories just before and just after each seed,
    then (NULL, NULL, id) for each memory `%(also)s` names, and the columns of all of them read in
    one join by primary key. One column list, not one per side: the statement's parsing and
    planning were most of its cost (§7.5 "Cost"), more than a B-tree descent per neighbour."""
    side = """
        (SELECT row_number() OVER (ORDER BY m.created_at {direction}) AS distance, m.id
           FROM memories_memory m
          WHERE {where} AND m.stack_id = s.stack_id AND m.kind = s.kind
            AND m.created_at {op} s.created_at AND m.created_at {op2} s.created_at {sign} %(gap)s::interval
          ORDER BY m.created_at {direction} LIMIT %(window)s)"""
    before = side.format(where=where, op="<", op2=">=", sign="-", direction="DESC")
    after = side.format(where=where, op=">", op2="<=", sign="+", direction="ASC")
    return f"""
        SELECT h.seed_id, h.distance, {MEMORY_ROWS.columns}
          FROM (SELECT s.id AS seed_id, n.distance, n.id
                  FROM memories_memory s
                  CROSS JOIN LATERAL ({before} UNION ALL {after}) n
                 WHERE s.id = ANY(%(seeds)s::uuid[])
                UNION ALL
                SELECT NULL, NULL, a.id FROM unnest(%(also)s::uuid[]) AS a(id)) h
          JOIN memories_memory m ON m.id = h.id
    """  # noqa: S608 - only fixed clauses are interpolated; values are parameters


def neighbour_rows(*, seeds: Sequence[Any], where: str, params: dict[str, Any], window: int = 1,
                   also: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    """(seed id, distance, *MEMORY_ROWS.fields) for the `window` memories just before and just after
    each seed (distance 1 = adjacent), within CONTEXT_MAX_GAP of the seed, same stack and kind,
    passing `where` (over alias `m`) - and (None, None, *MEMORY_ROWS.fields) for the memories `also`
    names, in no particular order: the search reads its page in the same statement, so context costs it no round
    trip of its own. Rows stay tuples (a model instance costs far more than a tuple, and most
    neighbours never reach the page): `memory_from_row` makes the few that do into memories."""
    if not seeds and not also:
        return []
    params = {**params, "seeds": uuid_array(seeds), "also": uuid_array(also), "gap": CONTEXT_MAX_GAP,
              "window": window}
    sql = _neighbour_sql(where)
    with connection.cursor() as cursor:
        # Its parsing and planning cost more than running it, and its plan is the same for every
        # search (seeds and page rows by primary key, a few (stack, kind, created_at) entries each
        # side): prepared once per session, with a generic plan (§7.5 "Cost").
        if (rows := fetch_prepared(cursor, sql, params, name=PREPARED_NAME, settings_sql=deadline_sql())) is not None:
            return rows
        execute_under_deadline(cursor, sql, params)
        return cursor.fetchall()


def memories_from_rows(rows: Sequence[Sequence[Any]]) -> list[Memory]:
    """Memories from MEMORY_ROWS.fields' column values, each converted as the ORM reads it (the JSON
    fields' parse), with the vector and the tsvector deferred."""
    return [MEMORY_ROWS.instance(row) for row in rows]
