"""Which database a read-only query may use (docs/production.md §4).

With `DATABASE_REPLICA_URL` set, the reads that can show data a moment old — the dashboard's charts
and backlog counts, a stack's usage series — go to the streaming replica (`read_alias()`), which
takes them off the primary. Everything else stays on the primary, because it must see the latest
committed state: writes, every access decision (stacks/selectors.py: a removed teacher must lose
access at once, not after the replica's lag), sync pull (an agent reads what it just pushed) and
the live feed's catch-up (a page resumes from a sequence number it got from the primary).

Two rules keep a replica read honest:

* inside a transaction every read stays on the primary (it must see the transaction's own writes,
  and its snapshot must be one database's);
* a query bound for the replica never embeds an access decision as a subquery: which stacks the
  caller sees is evaluated on the primary and passed in as values (`primary_values`).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, transaction
from django.db.models import QuerySet


def read_alias() -> str:
    """The alias for a read that tolerates the replica's lag: the replica when one is configured
    and no transaction is open on the primary; else the primary."""
    alias = str(getattr(settings, "DATABASE_READ_ALIAS", DEFAULT_DB_ALIAS))
    if alias != DEFAULT_DB_ALIAS and transaction.get_connection(DEFAULT_DB_ALIAS).in_atomic_block:
        return DEFAULT_DB_ALIAS
    return alias


def primary_values(queryset: QuerySet[Any], alias: str) -> QuerySet[Any] | list[Any]:
    """`queryset` (a `.values(...)` of one column, decided on the primary) as the right-hand side of
    an `__in` filter of a query that runs on `alias`: unchanged — one SQL statement with a subquery —
    when both are the primary; evaluated on the primary first when the outer query goes to the
    replica (a subquery there would decide on stale rows, and Django refuses cross-database
    subqueries anyway)."""
    if alias == (queryset.db or DEFAULT_DB_ALIAS):
        return queryset
    return [value for row in queryset for value in row.values()]
