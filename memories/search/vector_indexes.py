"""Per-stack partial HNSW indexes for large stacks.

pgvector 0.6 filters HNSW results *after* the graph walk, so one table-wide index serves a stack
that holds 10% of the rows with ~10% of each walk: recall falls and `ef_search` must grow 10x.
A partial index `... USING hnsw (embedding) WHERE stack_id = N` holds only that stack's rows, so
its walk needs no post-filter: full recall at a small `ef_search`. Small stacks do not need one
(they are searched exactly, memories.search.hybrid); stacks above STACK_INDEX_MIN_ROWS get one from the
periodic `memories.stack_vector_indexes` task (built CONCURRENTLY, so writes continue).
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from django.db import connection

from memories.lifecycle.jobs import JOB_STACK_VECTOR_INDEXES, Progress, run_job
from memories.models import JobRun
from memoryhub.index_swap import index_replace_concurrently
from stacks.models import Stack

logger = logging.getLogger(__name__)

STACK_INDEX_MIN_ROWS = 10_000
# A wider, better-connected graph than the table-wide index's (16/64). Memories of one student
# cluster tightly (same topics, same words), and on such data a 16/64 graph needed ef_search 800
# for recall@10 0.94 on a 100k-row stack; 24/200 reaches 0.96 at ef_search 200-300, so each
# search walks less. The price is build time (~2-3 min for 100k rows on two cores), paid once
# per stack by the periodic task, concurrently with writes. bench/search.py measures it.
STACK_INDEX_M = 24
STACK_INDEX_EF_CONSTRUCTION = 200
_PREFIX = "memories_hnsw_stack_"
_CACHE_SECONDS = 30.0
_cache: tuple[float, frozenset[int]] | None = None


def stack_index_name(stack_id: int) -> str:
    return f"{_PREFIX}{int(stack_id)}"


def stacks_with_vector_index(*, refresh: bool = False) -> frozenset[int]:
    """Stack ids that have a valid partial HNSW index (cached briefly; indexes change rarely)."""
    global _cache
    if not refresh and _cache is not None and time.monotonic() - _cache[0] < _CACHE_SECONDS:
        return _cache[1]
    ids = frozenset(stack_id for stack_id, (valid, _) in _stack_indexes().items() if valid)
    _cache = (time.monotonic(), ids)
    return ids


def _create_sql(name: str, stack_id: int, *, concurrently: bool) -> str:
    return (
        f'CREATE INDEX {"CONCURRENTLY " if concurrently else ""}IF NOT EXISTS "{name}" ON memories_memory '
        f"USING hnsw (embedding vector_cosine_ops) "
        f"WITH (m = {STACK_INDEX_M}, ef_construction = {STACK_INDEX_EF_CONSTRUCTION}) "
        # Live rows only (search reads with `forgotten_at IS NULL`): a decay tombstone adds no
        # entry to the graph.
        f"WHERE stack_id = {int(stack_id)} AND forgotten_at IS NULL"
    )


def _is_current(definition: str, stack_id: int) -> bool:
    """Whether an index definition (pg_get_indexdef) has today's parameters and predicate: an
    index built by an earlier release (16/64, or without the live-only predicate) is rebuilt."""
    return definition.endswith(
        f"WITH (m='{STACK_INDEX_M}', ef_construction='{STACK_INDEX_EF_CONSTRUCTION}') "
        f"WHERE ((stack_id = {int(stack_id)}) AND (forgotten_at IS NULL))"
    )


def _stack_indexes() -> dict[int, tuple[bool, str]]:
    """Every per-stack index: stack id -> (valid, definition)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """SELECT c.relname, i.indisvalid, pg_get_indexdef(i.indexrelid)
                 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
                WHERE i.indrelid = 'memories_memory'::regclass AND c.relname LIKE %s""",
            [_PREFIX + "%"],
        )
        rows = cursor.fetchall()
    return {int(m.group(1)): (valid, definition) for name, valid, definition in rows
            if (m := re.fullmatch(re.escape(_PREFIX) + r"(\d+)", name))}


def stack_vector_index_ensure(*, stack_id: int, concurrently: bool = True) -> bool:
    """Create the stack's partial HNSW index if missing, or rebuild it if it was built with other
    parameters or predicate. Returns True when one was built.

    `concurrently=True` needs autocommit (not inside a transaction): the normal case for the task.
    An outdated index keeps serving searches while its replacement builds (memoryhub.index_swap).
    An invalid leftover of an interrupted concurrent build is dropped and rebuilt.
    """
    name = stack_index_name(stack_id)
    valid, definition = _stack_indexes().get(stack_id, (None, ""))
    if valid and _is_current(definition, stack_id):
        return False
    with connection.cursor() as cursor:
        if valid and concurrently:
            index_replace_concurrently(cursor, name=name,
                                       create_sql=lambda temporary: _create_sql(temporary, stack_id, concurrently=True))
        else:
            if valid is not None:
                cursor.execute(f'DROP INDEX {"CONCURRENTLY " if concurrently else ""}IF EXISTS "{name}"')
            cursor.execute(_create_sql(name, stack_id, concurrently=concurrently))
    stacks_with_vector_index(refresh=True)
    return True


def stack_vector_indexes_sync(*, min_rows: int = STACK_INDEX_MIN_ROWS) -> dict[str, int]:
    """Give every stack with at least `min_rows` memories its partial index, and rebuild indexes an
    earlier release built with other parameters. One build per run, so a run stays short (a
    100k-row stack's graph takes minutes); missing indexes first, the next run continues."""
    existing = _stack_indexes()
    have = {stack_id for stack_id, (valid, _) in existing.items() if valid}
    outdated = sorted(stack_id for stack_id, (valid, definition) in existing.items()
                      if valid and not _is_current(definition, stack_id))
    missing = list(Stack.objects.filter(memory_count__gte=min_rows).exclude(pk__in=have)
                   .order_by("-memory_count").values_list("pk", flat=True)[:1])
    built = rebuilt = 0
    for stack_id in (missing or outdated)[:1]:
        started = time.monotonic()
        if stack_vector_index_ensure(stack_id=stack_id):
            if stack_id in have:
                rebuilt += 1
            else:
                built += 1
            logger.info("built %s in %.1fs", stack_index_name(stack_id), time.monotonic() - started)
    return {"built": built, "rebuilt": rebuilt, "indexed": len(have) + built,
            "outdated": len(outdated) - rebuilt}


def stack_vector_indexes_run(*, progress: Progress | None = None) -> JobRun:
    """Per-stack HNSW upkeep (this module: build one missing or outdated index) as a
    recorded job. The lock matters here more than anywhere: a large stack's build can outlast the
    schedule's interval, and a second run would drop the first one's index as an unfinished build."""
    def work(counts: dict[str, Any]) -> None:
        counts.update(stack_vector_indexes_sync())
        if progress is not None:
            progress(counts["built"] + counts["rebuilt"])

    return run_job(JOB_STACK_VECTOR_INDEXES, work)
