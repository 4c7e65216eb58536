"""The decay pass: recompute every memory's salience, tombstone what has faded, and the read of
what a pass would forget (forgetting candidates). The maths lives in `memories.lifecycle.decay`;
docs/algorithms.md describes both.

* **Set-based.** The pass is a few SQL statements per bounded batch of heap pages (a TID range
  scan, one short transaction per batch). No Python loop ever walks rows.
* **The wide table is read, not written.** The pass stores each memory's salience in the narrow
  `MemorySalience` side table (an upsert per batch); `memories_memory` is updated only for the
  few rows that cross the forget threshold (the tombstone).
* **Idempotent.** Salience is recomputed from the stored baseline (`last_reviewed_at`, else
  `created_at`) and `now`; running a pass twice at the same `now` changes nothing the second time.
* **Time is a parameter.** Every service takes `now` (default: the wall clock) so tests run on a
  virtual clock.

Why ~420 lines in one module: the pass's SQL statements and the batch runner that sequences them
share one temp table and one lock order; they are checked against each other here.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import OperationalError, connection, transaction
from django.db.models import FloatField
from django.db.models.expressions import RawSQL
from django.utils import timezone

from accounts.authors import job_author
from memories.lifecycle.decay import (
    FORGOTTEN_REASON_DECAY,
    NEVER_FADE_KINDS,
    never_fades_sql,
    salience_sql,
)
from memories.lifecycle.jobs import DEADLOCK_RETRIES, JOB_DECAY, Progress, is_retryable_conflict, run_job
from memories.models import JobRun, Memory
from memories.privacy.grants import Audience, grants_filter
from memories.writes.columns import DECAY_STATE, LIFECYCLE
from memories.writes.hooks import after_commit
from memories.writes.rows import lock_stack_changes
from memoryhub.errors import InvalidInput
from stacks.models import Stack

logger = logging.getLogger(__name__)

DECAY_BATCH_SIZE = 10_000
# Batches run on this many connections at once (the work is CPU-bound per row: salience maths,
# index maintenance for tombstones). Two keeps one core of a small database host for everyone else.
DECAY_WORKERS = 2
# A stored salience within this distance of the recomputed one is left alone: old memories change
# by less than this per day, so most rows are not rewritten by a daily pass (no dead tuples, no
# WAL). Rows crossing the forget threshold are always written.
SALIENCE_WRITE_TOLERANCE = 0.005
# The writer named in a tombstone's revision and in the change listeners' `MemoryChange.source`.
DECAY_SOURCE = "decay"
# The author of a decay tombstone's revision (docs/privacy.md "Provenance"): the job, no credential.
_DECAY_AUTHOR = json.dumps(job_author(DECAY_SOURCE).as_json())


# --- decay pass -------------------------------------------------------------------------------

# Batches are ranges of heap pages (a TID range scan), not of keys: a pass reads the table in
# physical order and dirties each page once, like a plain sequential UPDATE, instead of visiting
# every page once per key-range batch that has a row on it (uuid keys are scattered).
_TABLE_PAGES_SQL = """
SELECT pg_relation_size('memories_memory') / current_setting('block_size')::int,
       CASE WHEN c.relpages > 0 AND c.reltuples > 0 THEN c.reltuples / c.relpages ELSE 0 END
FROM pg_class c WHERE c.oid = 'memories_memory'::regclass
"""


def _recovered_since_baseline_sql(m: str, now: str, threshold: str) -> str:
    """SQL: memory `m` was recovered after its decay baseline and, counting the recovery as a
    review, is still above `threshold` — so it must not be forgotten again yet.

    Callers evaluate it only for rows that would otherwise be forgotten (inside a CASE), so the
    revision lookup (index on memory, created_at) costs nothing on a normal pass.
    """
    # Only module constants and caller-chosen aliases/placeholders are interpolated.
    return f"""EXISTS (
        SELECT 1 FROM memories_memoryrevision r
        WHERE r.memory_id = {m}.id AND r.action = 'recover'
          AND r.created_at > COALESCE({m}.last_reviewed_at, {m}.created_at)
          AND {salience_sql(m, now, baseline="r.created_at")} >= {threshold})"""  # noqa: S608


# A batch is three statements in one transaction, so that the stacks whose memories it tombstones
# are locked (`memories.writes.rows.lock_stack_changes`, the write kernel's change lock) after the batch
# knows which stacks those are and before anything is written: (1) read the batch's pages, compute
# salience, keep the rows to write in a temporary table and return the stacks to lock; (2) lock
# them, in pk order; (3) write: tombstones + their revisions, then the side-table salience. Every
# lock is taken in the writers' order (stack row, memory row, salience row), and a change_seq is
# drawn only under its stack's lock, so a reader paging the change feed by cursor never sees a
# later sequence number commit before an earlier one of the same stack.
_DECAY_BATCH_TABLE = "memories_decay_batch"

_DECAY_BATCH_TABLE_SQL = f"""
CREATE TEMPORARY TABLE {_DECAY_BATCH_TABLE} (
    row_ctid tid, heap_block integer, id uuid, stack_id bigint, version integer, last_reviewed_at timestamptz,
    side_ctid tid, old_salience float8, new_salience float8, forget boolean
) ON COMMIT DROP
"""

_DECAY_READ_SQL = f"""
WITH page_rows AS MATERIALIZED (
    -- The batch's pages and nothing else: MATERIALIZED keeps the planner from driving the scan
    -- from the (small) stacks table through an index on stack_id, which reads every row of the
    -- table for every batch. Only the columns salience and the tombstone need are carried.
    SELECT m.ctid AS row_ctid, (m.ctid::text::point)[0]::integer AS heap_block, m.id, m.stack_id, m.kind,
           m.confidence, m.times_accessed,
           m.emotional_valence, m.emotional_arousal, m.stability, m.last_reviewed_at, m.created_at,
           m.is_protected, m.version,
           {salience_sql("m", "%(now)s")} AS new_salience
    FROM memories_memory m
    WHERE m.ctid >= %(low)s::tid AND m.ctid < %(high)s::tid
      AND m.forgotten_at IS NULL AND m.deleted_at IS NULL
      AND (m.expires_at IS NULL OR m.expires_at > %(now)s)
),
stored AS MATERIALIZED (
    -- The saliences stored for rows on these pages (MemorySalience.heap_block): one index range
    -- scan, not a primary-key probe per row. A memory whose row moved since is not found here and
    -- counts as never stored: written again, with its new page.
    SELECT ms.ctid AS side_ctid, ms.memory_id, ms.salience FROM memories_memorysalience ms
    WHERE ms.heap_block >= %(low_block)s AND ms.heap_block < %(high_block)s
),
candidates AS (
    SELECT m.row_ctid, m.heap_block, m.id, m.stack_id, m.version, m.last_reviewed_at,
           s.side_ctid, m.new_salience, s.salience AS old_salience,
           CASE WHEN NOT {never_fades_sql("m")} AND m.new_salience < o.forget_threshold
                THEN NOT {_recovered_since_baseline_sql("m", "%(now)s", "o.forget_threshold")}
                ELSE false END AS forget
    FROM page_rows m
    JOIN stacks_stack st ON st.id = m.stack_id
    JOIN accounts_organization o ON o.id = st.organization_id
    LEFT JOIN stored s ON s.memory_id = m.id
    WHERE st.status = 'active'
),
kept AS (
    -- Only what the write step needs: rows crossing the threshold and rows whose salience moved
    -- by at least the tolerance (or was never stored). The rest is not written at all.
    INSERT INTO {_DECAY_BATCH_TABLE}
    SELECT c.row_ctid, c.heap_block, c.id, c.stack_id, c.version, c.last_reviewed_at,
           c.side_ctid, c.old_salience, c.new_salience, c.forget
    FROM candidates c
    WHERE c.forget OR c.old_salience IS NULL OR ABS(c.old_salience - c.new_salience) >= %(tolerance)s
    RETURNING stack_id, forget
)
SELECT (SELECT count(*) FROM candidates),
       ARRAY(SELECT DISTINCT k.stack_id FROM kept k WHERE k.forget ORDER BY k.stack_id)
"""  # noqa: S608 - only module constants are interpolated; values are bound parameters


# Besides its own before-state, a tombstone's revision keeps what explains it: the decay state
# that faded and the client's strength. The tombstone writes none of them, so the updated row
# returns their values as they were.
_TOMBSTONE_CONTEXT = (*sorted(DECAY_STATE), "strength")


def _tombstone_snapshot_sql() -> str:
    """SQL: the before-state a decay tombstone's revision keeps, over the `forgotten` rows `f`,
    from the write kernel's column groups (`memories.writes.columns`).

    Only the tombstone's own columns, not `SNAPSHOT_COLUMNS`: content is unchanged by a decay
    tombstone (the row stays), and a full snapshot would copy every forgotten row's text and data.
    The lifecycle columns held their live values (the pass tombstones only rows neither forgotten
    nor deleted); `salience` is the side table's last value.
    """
    fields = {f.attname: f for f in Memory._meta.concrete_fields}
    pairs = [("version", "f.old_version")]
    pairs += [(name, "NULL" if fields[name].null else "''") for name in sorted(LIFECYCLE)]
    pairs += [("salience", "f.old_salience")]
    pairs += [(name, f"f.{name}") for name in _TOMBSTONE_CONTEXT]
    return "jsonb_build_object(" + ", ".join(f"'{name}', {value}" for name, value in pairs) + ")"


_DECAY_FORGET_SQL = f"""
WITH forgotten AS (
    -- The only write to memories_memory: the rows that crossed the threshold (their stacks' change
    -- locks are held). Rows are found again by their physical address (no index lookups). A row a
    -- concurrent writer changed meanwhile has moved or fails these re-checks (READ COMMITTED
    -- re-evaluates them on the new row version): it is left for the next pass, never forgotten on
    -- stale state. The kernel's stamps for a change: version + 1, change_seq, server_updated_at.
    UPDATE memories_memory m SET
        forgotten_at = %(now)s,
        forgotten_reason = '{FORGOTTEN_REASON_DECAY}',
        version = m.version + 1,
        change_seq = nextval('memories_change_seq'),
        server_updated_at = %(now)s
    FROM {_DECAY_BATCH_TABLE} d
    WHERE d.forget AND m.ctid = d.row_ctid AND m.id = d.id AND m.version = d.version
      AND m.forgotten_at IS NULL AND m.deleted_at IS NULL
      AND m.last_reviewed_at IS NOT DISTINCT FROM d.last_reviewed_at
    RETURNING m.id, m.stack_id, d.version AS old_version, d.old_salience,
              {", ".join(f"m.{name}" for name in _TOMBSTONE_CONTEXT)}
),
revisions AS (
    -- The before-state of every tombstone, like every other forget (`_tombstone_snapshot_sql`).
    INSERT INTO memories_memoryrevision (memory_id, version, source, action, reason, snapshot, author, created_at)
    SELECT f.id, f.old_version, '{DECAY_SOURCE}', 'forget', '{FORGOTTEN_REASON_DECAY}',
           {_tombstone_snapshot_sql()}, %(author)s::jsonb, %(now)s
    FROM forgotten f
    RETURNING 1
)
-- The tombstoned ids per stack, for the after-commit effects (change listeners).
SELECT f.stack_id, array_agg(f.id) FROM forgotten f GROUP BY f.stack_id
"""  # noqa: S608 - only module constants and model column names are interpolated; values are bound parameters

_DECAY_SALIENCE_SQL = f"""
-- Salience goes to the narrow side table, never to memories_memory. A value computed at a later
-- time (a review that raced this pass) is never overwritten with this pass's older one.
WITH rewritten AS (
    -- Side rows the read step found are rewritten by their physical address (no index probe). One
    -- a review changed meanwhile has moved: the address no longer matches it (READ COMMITTED
    -- re-checks the newest version), so the review's later value stays.
    UPDATE memories_memorysalience ms
    SET salience = d.new_salience, computed_at = %(now)s, heap_block = d.heap_block
    FROM {_DECAY_BATCH_TABLE} d
    WHERE d.side_ctid IS NOT NULL AND ms.ctid = d.side_ctid AND ms.memory_id = d.id
      AND ms.computed_at <= %(now)s
    RETURNING 1
),
inserted AS (
    -- Never stored, or stored under another page (the memory's row moved): an upsert.
    INSERT INTO memories_memorysalience AS ms (memory_id, salience, computed_at, heap_block)
    SELECT d.id, d.new_salience, %(now)s, d.heap_block FROM {_DECAY_BATCH_TABLE} d
    WHERE d.side_ctid IS NULL
    ON CONFLICT (memory_id) DO UPDATE
        SET salience = EXCLUDED.salience, computed_at = EXCLUDED.computed_at, heap_block = EXCLUDED.heap_block
        WHERE ms.computed_at <= EXCLUDED.computed_at
    RETURNING 1
)
SELECT (SELECT count(*) FROM rewritten) + (SELECT count(*) FROM inserted)
"""  # noqa: S608 - only module constants are interpolated; values are bound parameters


@dataclass
class DecayBatch:
    scanned: int
    updated: int
    forgotten: int


def _decay_batch(*, low_page: int, high_page: int, now: datetime, tolerance: float) -> DecayBatch:
    params: dict[str, Any] = {"low": f"({low_page},0)", "high": f"({high_page},0)", "low_block": low_page,
                              "high_block": high_page, "now": now, "tolerance": tolerance, "author": _DECAY_AUTHOR}
    for attempt in range(DEADLOCK_RETRIES):
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(_DECAY_BATCH_TABLE_SQL)
                cursor.execute(_DECAY_READ_SQL, params)
                scanned, stacks_to_lock = cursor.fetchone()
                forgotten = 0
                if stacks_to_lock:
                    lock_stack_changes(*stacks_to_lock)  # one statement, pk order
                    cursor.execute(_DECAY_FORGET_SQL, params)
                    for stack_id, ids in cursor.fetchall():
                        # Once per stack, with the ids the tombstone returned: a listener (live
                        # events) hears of them after commit, never of a batch that rolled back.
                        after_commit(stack_id=stack_id, source=DECAY_SOURCE, changes=[("forget", ids)])
                        forgotten += len(ids)
                cursor.execute(_DECAY_SALIENCE_SQL, params)
                updated = int(cursor.fetchone()[0])
                # ON COMMIT DROP covers the normal case; dropping here also covers a batch that
                # runs inside an outer transaction (a savepoint commits nothing).
                cursor.execute(f"DROP TABLE {_DECAY_BATCH_TABLE}")
            return DecayBatch(int(scanned), int(updated), forgotten)
        except OperationalError as exc:
            if not is_retryable_conflict(exc) or attempt == DEADLOCK_RETRIES - 1:
                raise
            logger.warning("decay batch collided with a concurrent write; retrying")
    raise AssertionError("unreachable")


def _batch_ranges(*, batch_size: int) -> list[tuple[int, int]]:
    """The table's pages as they are now, in ranges of about `batch_size` rows."""
    with connection.cursor() as cursor:
        cursor.execute(_TABLE_PAGES_SQL)
        row = cursor.fetchone()
    total_pages, rows_per_page = (int(row[0]), float(row[1])) if row else (0, 0.0)
    # Until ANALYZE knows the real density, assume ~16 rows per 8 KB page.
    density = rows_per_page if rows_per_page > 0 else 16.0
    pages_per_batch = max(1, int(batch_size / density))
    return [(low, low + pages_per_batch) for low in range(0, total_pages, pages_per_batch)]


def _decay_worker(ranges: Iterator[tuple[int, int]], ranges_lock: threading.Lock, now: datetime, tolerance: float,
                  results: queue.Queue[DecayBatch | BaseException | None], stop: threading.Event) -> None:
    """One worker thread: takes the next page range until none is left (or the run stops)."""
    try:
        while not stop.is_set():
            with ranges_lock:
                page_range = next(ranges, None)
            if page_range is None:
                break
            results.put(_decay_batch(low_page=page_range[0], high_page=page_range[1], now=now, tolerance=tolerance))
    except BaseException as exc:  # handed to the coordinating thread, which re-raises it
        results.put(exc)
    finally:
        connection.close()  # the thread's own connection
        results.put(None)


def _decay_batches(*, now: datetime, batch_size: int, tolerance: float, workers: int, counts: dict[str, Any],
                   progress: Progress | None) -> None:
    """Walk the table's pages as they were when the pass began, about `batch_size` rows at a time.

    Rows written after that (new memories, or versions a concurrent write moved past the end) wait
    for the next pass; a row version a concurrent write moved into a page range the pass has yet to
    visit is looked at again but not rewritten (its salience is already current), so `scanned` can
    count a few rows twice. (The pass itself moves only the rows it tombstones, which it skips.)

    With `workers` > 1 the ranges are shared out to that many threads, each with its own
    connection and short transactions (batches touch disjoint pages; two batches that tombstone in
    one stack take its change lock one after the other). Inside an outer transaction (tests) the
    batches run on the caller's connection, one after another: other connections could not see
    its rows.
    """
    counts.update(scanned=0, updated=0, forgotten=0, batches=0)
    ranges = _batch_ranges(batch_size=batch_size)

    def add(batch: DecayBatch) -> None:
        counts["scanned"] += batch.scanned
        counts["updated"] += batch.updated
        counts["forgotten"] += batch.forgotten
        counts["batches"] += 1
        if progress is not None:
            progress(batch.scanned)

    threads = min(workers, len(ranges))
    if threads <= 1 or connection.in_atomic_block:
        for low_page, high_page in ranges:
            add(_decay_batch(low_page=low_page, high_page=high_page, now=now, tolerance=tolerance))
        return
    counts["workers"] = threads
    pending = iter(ranges)
    ranges_lock = threading.Lock()
    stop = threading.Event()
    results: queue.Queue[DecayBatch | BaseException | None] = queue.Queue()
    started = [threading.Thread(target=_decay_worker, name=f"decay-{n}", daemon=True,
                                args=(pending, ranges_lock, now, tolerance, results, stop))
               for n in range(threads)]
    for thread in started:
        thread.start()
    failure: BaseException | None = None
    running = threads
    try:
        while running:
            item = results.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                failure = failure or item
                stop.set()
            else:
                add(item)
    except BaseException:  # e.g. Celery's soft time limit, raised in this thread: let workers finish their batch
        stop.set()
        for thread in started:
            thread.join()
        while not results.empty():  # batches committed meanwhile still count
            if isinstance(item := results.get_nowait(), DecayBatch):
                add(item)
        raise
    if failure is not None:
        raise failure


def decay_pass(*, now: datetime | None = None, batch_size: int = DECAY_BATCH_SIZE,
               tolerance: float = SALIENCE_WRITE_TOLERANCE, workers: int = DECAY_WORKERS,
               progress: Progress | None = None) -> JobRun:
    """Recompute the salience of every live memory and tombstone what has faded.

    A memory is tombstoned (`forgotten_at=now`, `forgotten_reason="salience_decay"`, version +1,
    change feed stamped, a revision with its before-state) when its salience is below its school's
    `Organization.forget_threshold`, unless it is protected, a value or a drive, or was recovered
    recently enough that its salience counted from the recovery is still above the threshold.
    Skipped: forgotten, deleted and expired rows, and archived stacks (frozen: they refuse writes).
    The client's `strength`, `times_accessed` and `last_accessed` are never written.

    The salience goes to `MemorySalience`; `memories_memory` is written only for tombstones.
    Salience changes do not stamp the change feed: salience is server-side ranking state, not part
    of a synced record, and re-sending every record to every client daily would be the cost.
    Tombstones follow the write kernel's rules (`memories.writes`): their stacks' change locks
    (`lock_stack_changes`) before a change_seq is drawn, and after commit one
    `MemoryChange("forget", source="decay")` per stack and batch. Batches run on `workers`
    connections at once. Counts: scanned, updated (salience rows written), forgotten, batches
    (, workers).
    """
    if batch_size < 1:
        raise InvalidInput("batch_size must be positive.", fields={"batch_size": ["Must be at least 1."]})
    if workers < 1:
        raise InvalidInput("workers must be positive.", fields={"workers": ["Must be at least 1."]})
    at = now or timezone.now()
    return run_job(JOB_DECAY, lambda counts: _decay_batches(
        now=at, batch_size=batch_size, tolerance=tolerance, workers=workers, counts=counts, progress=progress))


def forgetting_candidates(*, stack: Stack, now: datetime | None = None, limit: int = 50,
                          audience: Audience | None = None) -> list[Memory]:
    """What the decay pass at `now` would forget in this stack, most faded first (a read).

    Each memory carries `current_salience` (at `now`). The caller resolved `stack` through
    `stacks.selectors`. Archived stacks are not decayed, so they have no candidates. A requester
    other than the stack's own credentials passes its `audience` (memories.privacy.grants): only memories
    its grants admit are listed.
    """
    at = now or timezone.now()
    if stack.is_archived:
        return []
    threshold = stack.organization.forget_threshold
    table = Memory._meta.db_table
    recovered = _recovered_since_baseline_sql(table, "%s", "%s")
    queryset = (
        Memory.objects.filter(stack_id=stack.pk, forgotten_at__isnull=True, deleted_at__isnull=True,
                              is_protected=False)
        .exclude(kind__in=NEVER_FADE_KINDS)
        .exclude(expires_at__lte=at)
        .annotate(current_salience=RawSQL(salience_sql(table, "%s"), [at], output_field=FloatField()))  # noqa: S611
        .filter(current_salience__lt=threshold)
        # Only module constants are interpolated; `now` and the threshold are bound parameters.
        .extra(where=[f"NOT {recovered}"], params=[at, threshold])  # noqa: S610
        .order_by("current_salience", "created_at", "id")
    )
    return list(grants_filter(queryset, audience)[:limit])




def forgotten_by(*, stack: Stack, times: list[datetime]) -> list[int]:
    """How many of the stack's live memories the decay pass would have forgotten by each of `times`,
    if nothing were written, reviewed or recovered meanwhile (a read, one query).

    The same rule as the pass and `forgetting_candidates` (salience below the school's threshold,
    never-fading kinds and protected memories exempt, a recent recovery spares): salience only
    falls with time, so each count includes the earlier ones. Archived stacks are not decayed.
    """
    if stack.is_archived or not times:
        return [0 for _ in times]
    threshold = stack.organization.forget_threshold
    columns = ", ".join(
        f"count(*) FILTER (WHERE {salience_sql('m', f'%(t{i})s')} < %(threshold)s"
        f" AND NOT {_recovered_since_baseline_sql('m', f'%(t{i})s', '%(threshold)s')})"
        for i in range(len(times)))
    # Only module constants and generated placeholders are interpolated; values are bound parameters.
    sql = f"""
        SELECT {columns} FROM memories_memory m
        WHERE m.stack_id = %(stack)s AND m.forgotten_at IS NULL AND m.deleted_at IS NULL
          AND (m.expires_at IS NULL OR m.expires_at > %(t0)s) AND NOT {never_fades_sql('m')}
    """  # noqa: S608
    params: dict[str, Any] = {"stack": stack.pk, "threshold": threshold}
    params.update({f"t{i}": at for i, at in enumerate(times)})
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return [int(value or 0) for value in row] if row else [0 for _ in times]
