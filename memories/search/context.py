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

This module builds and runs that one statement; memories.search.hybrid decides the seeds and the
share, so the WHERE clause and the column contract stay that module's.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.db import connection

# A pause longer than this between two memories of a stack ends a conversation session. Chat turns
# are seconds to a few minutes apart; an agent that comes back after a quarter of an hour is in a
# new conversation, whose opening has nothing to do with the last words of the previous one.
CONTEXT_MAX_GAP = timedelta(minutes=15)


def neighbour_rows(*, seeds: Sequence[Any], where: str, params: dict[str, Any], columns: str,
                   window: int = 1) -> list[tuple[Any, ...]]:
    """(seed id, *columns, distance) for the `window` memories just before and just after each
    seed (distance 1 = adjacent), within CONTEXT_MAX_GAP of the seed, same stack and kind, passing
    `where` (over alias `m`)."""
    if not seeds:
        return []
    params = {**params, "seeds": list(seeds), "gap": CONTEXT_MAX_GAP, "window": window}
    side = """
        (SELECT {columns}, row_number() OVER (ORDER BY m.created_at {direction}) AS distance
           FROM memories_memory m
          WHERE {where} AND m.stack_id = s.stack_id AND m.kind = s.kind
            AND m.created_at {op} s.created_at AND m.created_at {op2} s.created_at {sign} %(gap)s
          ORDER BY m.created_at {direction} LIMIT %(window)s)"""
    before = side.format(columns=columns, where=where, op="<", op2=">=", sign="-", direction="DESC")
    after = side.format(columns=columns, where=where, op=">", op2="<=", sign="+", direction="ASC")
    sql = f"""
        SELECT s.id, n.*
          FROM memories_memory s
          CROSS JOIN LATERAL ({before} UNION ALL {after}) n
         WHERE s.id = ANY(%(seeds)s::uuid[])
    """  # noqa: S608 - only fixed clauses are interpolated; values are parameters
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()
