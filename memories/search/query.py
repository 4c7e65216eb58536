"""What a hybrid search is asked and answers, and the contract its two legs share.

* `SearchQuery` (the request), `SearchHit` and `SearchResult` (the answer, each hit explaining its
  score: the legs' own scores and ranks, `match_type`, `boosts`; docs/algorithms.md §7.5), and what
  `SearchResult.legs` says of a leg (§7.1).
* `scope_filters`: the WHERE clause every statement of a search shares - the stack scope,
  deletion, forgetting, expiry, privacy grants and the query's filters, all inside SQL.
* `LEG_COLUMNS` / `SCORE`: the columns both legs return, in the order the fusion
  (memories.search.fusion) reads them by position.
* `search_deadline` / `execute_under_deadline`: every statement of a search carries the search's
  statement timeout in its own query string (§7.4), so a search needs no transaction of its own.

memories.search.hybrid runs a search; memories.search.keyword_leg and memories.search.vector_leg
are its legs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection
from django.utils import timezone

from memories.models import Memory
from memories.privacy.grants import Audience, grants_sql
from memories.selectors import LIVE_SQL, MEMORY_ROWS
from memoryhub.database import skip_to_rows

MAX_LIMIT = 100
MAX_QUERY_CHARS = 2000
# MiniLM puts unrelated text well below this and paraphrases well above it (docs/algorithms.md §7.1).
DEFAULT_MIN_SIMILARITY = 0.25

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


@dataclass
class SearchHit:
    memory: Memory
    combined_score: float
    fused_score: float  # the legs' fused score, before weighting
    keyword_score: float | None  # the keyword leg's score normalised by its best hit, in [0, 1]
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
    # Each leg: "ran" or "skipped: <reason>" (memories.search.hybrid's docstring).
    legs: dict[str, str] = field(default_factory=lambda: {"keyword": LEG_RAN, "semantic": LEG_RAN})


def over_fetch(limit: int) -> int:
    return max(limit, min(max(3 * limit, 30), MAX_LIMIT))


_PLAIN_QUERY = re.compile(r'^[^"]*$')


def is_plain(text: str) -> bool:
    """Plain words: no websearch syntax (quotes, `or`, -exclusions)."""
    return bool(_PLAIN_QUERY.match(text)) and not re.search(r"(^|\s)-\w|\bor\b", text, re.I)


def scope_filters(query: SearchQuery, params: dict[str, Any], audience: Audience | None = None) -> str:
    """The WHERE clause every leg shares; the stack scope is mandatory, never optional. A requester
    other than the stack's own credentials also gets the privacy-grants predicate (memories.privacy.grants),
    here, inside each leg's SQL and before its LIMIT, so a hidden memory never takes a slot."""
    clauses = [
        "m.stack_id = ANY(%(stack_ids)s)",
        LIVE_SQL,
        "m.forgotten_at IS NULL",
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
LEG_COLUMNS = ("m.id, m.stability, m.confidence, m.created_at, m.last_reviewed_at, m.kind, m.times_accessed, "
               "m.emotional_valence, m.emotional_arousal")
SCORE = 9  # index of the leg's own score column (after LEG_COLUMNS)
# Where each leg column sits in a context row (memories.selectors.MEMORY_ROWS, its fields in order).
LEG_FIELD_INDEXES = tuple([f.column for f in MEMORY_ROWS.fields].index(column.removeprefix("m."))
                          for column in LEG_COLUMNS.split(", "))


# The statement timeout of the search running on this thread, in milliseconds (None: no search).
_DEADLINE_MS: ContextVar[int | None] = ContextVar("search_deadline_ms", default=None)


@contextmanager
def search_deadline(timeout_ms: int) -> Iterator[None]:
    """Inside the block, every statement sent through `execute_under_deadline` (and `fetch_rows`)
    runs under `statement_timeout` = `timeout_ms` (docs/algorithms.md §7.4)."""
    token = _DEADLINE_MS.set(int(timeout_ms))
    try:
        yield
    finally:
        _DEADLINE_MS.reset(token)


def deadline_sql() -> str:
    """`SET LOCAL statement_timeout = …; ` inside `search_deadline`, else ""."""
    timeout_ms = _DEADLINE_MS.get()
    return "" if timeout_ms is None else f"SET LOCAL statement_timeout = {timeout_ms}; "


def execute_under_deadline(cursor: Any, sql: str, params: Any, *, settings_sql: str = "") -> None:
    """Execute `sql` with the search's deadline and `settings_sql` ("SET LOCAL …; ") before it, in
    one query string, and leave `cursor` at the first result that has rows.

    The connection binds parameters client-side, so the string goes as one simple query, which
    PostgreSQL runs as one implicit transaction: `SET LOCAL` lasts exactly until its statements end.
    A search outside any transaction thus saves the BEGIN and COMMIT round trips a transaction of
    its own would cost, and still keeps its deadline on every statement."""
    cursor.execute(deadline_sql() + settings_sql + sql, params)
    skip_to_rows(cursor)  # past the SET statements


def fetch_rows(sql: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        execute_under_deadline(cursor, sql, params)
        return cursor.fetchall()
