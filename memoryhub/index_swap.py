"""Replace a PostgreSQL index with a new definition without blocking writes.

A plain CREATE INDEX holds a SHARE lock for the whole build, and every INSERT/UPDATE of the table
waits on it: the table-wide HNSW graph of a million memories takes many minutes to build. Here
the new index is built CONCURRENTLY under a temporary name next to the old one (which keeps serving
reads), then the old one is dropped CONCURRENTLY and the new one takes its name.

Only outside a transaction (autocommit), like any concurrent index build. Re-runnable after an
interruption at any step: whatever is left under the temporary name (an invalid half-built index,
or a finished one whose rename was lost) is dropped and built again, then the swap completes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

MAX_IDENTIFIER = 63  # PostgreSQL truncates longer names


def temporary_index_name(name: str) -> str:
    suffix = "_swap"
    return name[: MAX_IDENTIFIER - len(suffix)] + suffix


def index_replace_concurrently(cursor: Any, *, name: str, create_sql: Callable[[str], str]) -> None:
    """Give index `name` the definition `create_sql(index_name)` (a `CREATE INDEX CONCURRENTLY`
    statement for the given name) without blocking writes."""
    temporary = temporary_index_name(name)
    cursor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{temporary}"')
    statement = create_sql(temporary)
    if "CONCURRENTLY" not in statement.upper():
        raise ValueError("index_replace_concurrently needs a CREATE INDEX CONCURRENTLY statement")
    cursor.execute(statement)
    cursor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{name}"')
    cursor.execute(f'ALTER INDEX "{temporary}" RENAME TO "{name}"')
