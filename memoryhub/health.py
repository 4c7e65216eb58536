"""Readiness checks: each answers quickly and reports what failed, never raises."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis
from django.conf import settings
from django.db import connection

from memoryhub.celery import app as celery_app
from memoryhub.worker_priority import AWAITING_VECTORS, BACKLOG_STACKS_CTE, OLDEST_AWAITING_IN_W

CHECK_TIMEOUT_SECONDS = 2.0


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    detail: str


def check_database() -> CheckResult:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
            row = cursor.fetchone()
    except Exception as exc:  # any failure means "not ready"; the type is enough to diagnose
        connection.close_if_unusable_or_obsolete()
        return CheckResult(False, f"unreachable ({type(exc).__name__})")
    if row is None:
        return CheckResult(False, "pgvector extension missing (run migrations)")
    return CheckResult(True, f"ok (pgvector {row[0]})")


def check_redis() -> CheckResult:
    try:
        client = redis.Redis.from_url(
            settings.REDIS_URL, socket_connect_timeout=CHECK_TIMEOUT_SECONDS, socket_timeout=CHECK_TIMEOUT_SECONDS
        )
        client.ping()
        client.close()
    except Exception as exc:
        return CheckResult(False, f"unreachable ({type(exc).__name__})")
    return CheckResult(True, "ok")


def check_celery_workers(redis_ok: bool) -> CheckResult:
    if not redis_ok:
        return CheckResult(False, "unknown: the broker (redis) is down")
    try:
        replies = celery_app.control.ping(timeout=1.0)
    except Exception as exc:
        return CheckResult(False, f"unreachable ({type(exc).__name__})")
    if not replies:
        return CheckResult(False, "no worker answered")
    return CheckResult(True, f"ok ({len(replies)} worker{'s' if len(replies) != 1 else ''})")


def readiness() -> dict[str, CheckResult]:
    database = check_database()
    redis_result = check_redis()
    return {
        "database": database,
        "redis": redis_result,
        "celery": check_celery_workers(redis_result.ok),
    }


# What memories.search.embedding_backlog.embedding_backlog_count counts, read here as plain SQL
# (memoryhub.worker_priority: why, and the index it reads), counted up to BACKLOG_COUNT_CAP only.
# /readyz and /metrics read it at every probe and scrape, and counting reads every awaiting row: a
# large import's backlog would make the probe slower with each row, up to its timeout
# (docs/operations.md §11). Past the cap, the lag below says how far behind embedding is. Counted
# to one past it, so that "more than the cap" shows (as the overview's count does, dashboard.overview).
BACKLOG_COUNT_CAP = 100_000
EMBEDDING_BACKLOG_SQL = f"SELECT count(*) FROM (SELECT 1 {AWAITING_VECTORS} LIMIT %(limit)s) awaiting"  # noqa: S608 - fixed text


# The same count, and how long ago the oldest awaiting row last changed: how long the memory that
# has waited longest has gone without a current vector, the time to searchable an operator watches
# (/metrics). The oldest is each backlog stack's oldest, one index probe a stack (as the runner's
# look finds it), not a minimum over every awaiting row.
EMBEDDING_LAG_SQL = f"""
WITH RECURSIVE {BACKLOG_STACKS_CTE}
SELECT ({EMBEDDING_BACKLOG_SQL}),
       GREATEST(0, EXTRACT(EPOCH FROM statement_timestamp() - (
           SELECT min(o.oldest) FROM (SELECT {OLDEST_AWAITING_IN_W} AS oldest
                                        FROM waiting w WHERE w.stack_id IS NOT NULL) o)))
"""  # noqa: S608 - only fixed text is interpolated; the limit is a parameter


def _informational_row(sql: str) -> tuple[Any, ...] | None:
    """The one row `sql` answers, or None when the database cannot answer (the database check
    already reports that; these figures never fail readiness)."""
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql, {"limit": BACKLOG_COUNT_CAP + 1})
            row = cursor.fetchone()
        return tuple(row)
    except Exception:  # informational only; readiness must not fail because of it
        connection.close_if_unusable_or_obsolete()
        return None


def embedding_backlog() -> tuple[int, bool] | None:
    """How many memories await a current embedding, at most BACKLOG_COUNT_CAP, and whether more do
    (None: the database cannot answer)."""
    row = _informational_row(EMBEDDING_BACKLOG_SQL)
    return None if row is None else (min(int(row[0]), BACKLOG_COUNT_CAP), int(row[0]) > BACKLOG_COUNT_CAP)


def embedding_backlog_and_lag() -> tuple[int, float] | None:
    """How many memories await a current embedding (up to BACKLOG_COUNT_CAP), and the seconds since
    the oldest of them last changed (0 when none awaits); None when the database cannot answer."""
    row = _informational_row(EMBEDDING_LAG_SQL)
    return None if row is None else (min(int(row[0]), BACKLOG_COUNT_CAP), float(row[1] or 0))
