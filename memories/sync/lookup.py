"""The stored rows a sync batch names, read with one query — and the plan check that keeps it O(batch).

A push names up to 1,000 (kind, record_id) keys; the engine needs the stored row of each (or
none) before it applies anything. `_lookup_existing` reads them all at once. Why the query looks
the way it does, and why its plan is checked before it runs, is said below.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import psycopg
from django.core.cache import cache
from django.db import DatabaseError, connection, transaction

from memories.models import Memory
from memories.selectors import MEMORY_ROWS
from memories.writes.columns import array_literal
from stacks.models import Stack

logger = logging.getLogger(__name__)

#
# One probe of the unique (stack, kind, record_id) index per key is what we want: O(batch), whatever
# the stack's size. LATERAL ... LIMIT 1 (the key is unique, so LIMIT changes nothing) keeps the
# planner from flattening it into a join, which it plans as a hash join over the WHOLE stack as soon
# as it believes the stack is small (linear in the stack).
# But when the statistics are stale — a fresh table, or a stack that grew faster than autovacuum
# re-analyses it — the planner believes (stack, kind) holds about one row and probes the smaller
# (stack, kind, created_at) index instead, filtering every row of that kind per key. So the plan
# is checked before it is run (`_lookup_existing`): a wrong plan on a large stack refreshes the
# statistics of the two columns that decide it (at most once a minute), and if that is not possible
# the plain join is used, which is linear in the stack but never per key. What each plan costs:
# docs/benchmarks.md "Figures behind code choices".
# The embedding (1.5 kB) and the tsvector are never needed here: MEMORY_ROWS leaves them deferred.
# The rows become memories through it, not `raw()`, whose per-call setup (the result's columns
# matched to the model's, each field's converters looked up) cost more than the probe itself on a
# small push.
# Built from the model's column names only; every value is a bound parameter.
_EXISTING_PROBE_SQL = (
    f"SELECT {MEMORY_ROWS.columns} FROM unnest(%s::varchar[], %s::varchar[]) AS k(kind, record_id) "  # noqa: S608
    "CROSS JOIN LATERAL (SELECT * FROM memories_memory m WHERE m.stack_id = %s AND m.kind = k.kind "
    "AND m.record_id = k.record_id LIMIT 1) m"
)
_EXISTING_JOIN_SQL = (
    f"SELECT {MEMORY_ROWS.columns} FROM unnest(%s::varchar[], %s::varchar[]) AS k(kind, record_id) "  # noqa: S608
    "JOIN memories_memory m ON m.stack_id = %s AND m.kind = k.kind AND m.record_id = k.record_id"
)
_UNIQUE_INDEX = "memories_memory_record_unique"
# Below this many rows any plan is cheap; above it a per-key scan of the stack is not.
_PROBE_CHECK_MIN_ROWS = 2000
_ANALYZE_CACHE_KEY = "memories:sync:analyze"
_ANALYZE_INTERVAL_SECONDS = 60
# stack pk -> until when this process trusts the probe's plan for that stack
_probe_trusted_until: dict[int, float] = {}
_PROBE_TRUST_SECONDS = 300.0


def _plan_uses(plan: Any, index_name: str) -> bool:
    if isinstance(plan, list):
        return any(_plan_uses(p, index_name) for p in plan)
    if isinstance(plan, dict):
        return plan.get("Index Name") == index_name or any(
            _plan_uses(v, index_name) for k, v in plan.items() if k in ("Plan", "Plans"))
    return False


def _probe_planned_well(params: list[Any]) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + _EXISTING_PROBE_SQL, params)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    return _plan_uses(plan, _UNIQUE_INDEX)


def _refresh_statistics() -> bool:
    """ANALYZE the two columns the probe's plan depends on, at most once a minute across processes.
    Never waits for a lock (autovacuum may hold it); any failure just means "not refreshed"."""
    try:
        if not cache.add(_ANALYZE_CACHE_KEY, 1, _ANALYZE_INTERVAL_SECONDS):
            return False
    except Exception:  # the cache is an optimisation here, never a reason to fail a push
        return False
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('lock_timeout'), set_config('lock_timeout', '50ms', true)")
            previous = cursor.fetchone()[0]
            cursor.execute("ANALYZE memories_memory (stack_id, kind)")
            cursor.execute("SELECT set_config('lock_timeout', %s, true)", [previous])
    except (DatabaseError, psycopg.Error) as exc:
        logger.info("could not refresh memories statistics before a sync lookup (%s)", type(exc).__name__)
        return False
    logger.info("refreshed memories statistics: a stack outgrew them")
    return True


def _has_statistics() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT EXISTS (SELECT 1 FROM pg_stats WHERE schemaname = current_schema() "
                       "AND tablename = 'memories_memory' AND attname = 'stack_id')")
        return bool(cursor.fetchone()[0])


def _probe_is_safe(stack: Stack, params: list[Any]) -> bool:
    """Will the probe query use the unique index for this stack? Checked with EXPLAIN; a plan seen
    with real statistics is trusted for a while (a growing stack only makes it more certain), one
    seen without them is not (it flips as the table grows)."""
    if _probe_trusted_until.get(stack.pk, 0.0) > time.monotonic():
        return True
    with_statistics = _has_statistics() or (_refresh_statistics() and _has_statistics())
    if not _probe_planned_well(params):
        if not (_refresh_statistics() and _probe_planned_well(params)):
            return False
        with_statistics = _has_statistics()
    if with_statistics:
        if len(_probe_trusted_until) > 10_000:
            _probe_trusted_until.clear()
        _probe_trusted_until[stack.pk] = time.monotonic() + _PROBE_TRUST_SECONDS
    return True


def _lookup_existing(stack: Stack, keys: set[tuple[str, str]]) -> list[Memory]:
    """The stored rows (any state: live, forgotten, deleted) of `keys` = {(kind, record_id)} in
    `stack`, in no particular order; keys with no row are simply absent. The sync engine's one read."""
    kinds, record_ids = zip(*keys, strict=True)
    # Arrays passed as one literal each: psycopg adapts a list of strings element by element.
    params: list[Any] = [array_literal(kinds), array_literal(record_ids), stack.pk]
    # Over a small stack a join costs no more than probes, whatever its plan.
    probe = stack.memory_count >= _PROBE_CHECK_MIN_ROWS and _probe_is_safe(stack, params)
    with connection.cursor() as cursor:
        cursor.execute(_EXISTING_PROBE_SQL if probe else _EXISTING_JOIN_SQL, params)
        return [MEMORY_ROWS.instance(row) for row in cursor.fetchall()]

