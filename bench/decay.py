"""Decay pass speed: one full pass over N memories, next to baselines measured in the same run.

    .venv/bin/python bench/decay.py                 # 1,000,000 memories (the goal size)
    .venv/bin/python bench/decay.py --rows 100000   # a quicker run

The pass reads `memories_memory` (the wide row: text, JSON, arrays, generated tsvector, ~9
indexes) and writes each memory's salience to the narrow side table `memories_memorysalience`;
only the rows it tombstones are updated in `memories_memory` (and add no entry to the live-only
indexes: search GIN, tag GIN, (stack, kind, created)). A batch finds the stored saliences of
its heap pages through `MemorySalience.heap_block` (one index range scan, no per-row probe).

The dataset: memories created uniformly over the last `--days-back` days, never reviewed, no
embeddings, then a first pass ever: about a third of the rows are
already faded and are tombstoned at once. A pass on a live system (beat: hourly) forgets only what
crossed the threshold since the previous run, like the next-day figure. Figures printed:

* **decay pass (first)** — `memories.lifecycle.decay_pass` right after the import, with an empty
  side table: salience for every live memory (one row inserted each), tombstones for everything
  already below the threshold (about a third of a year of untouched memories), revisions for them,
  the stacks' change locks, bounded batches with one transaction each on `--workers` connections,
  JobRun bookkeeping.
* **bare UPDATE, side table** — `UPDATE memories_memorysalience SET salience = …, computed_at = …`
  over every side row the pass wrote, one statement: the floor for rewriting the table the pass
  writes once; THE baseline of the passes that write (almost) no tombstones.
* **bare UPDATE, the tombstoned wide rows** — one `UPDATE memories_memory SET forgotten_at = …,
  forgotten_reason = …, version = version + 1, change_seq = nextval(…), server_updated_at = …` over
  exactly the rows the first pass tombstoned (the same columns it writes, so the same index work),
  right after a VACUUM like the pass had. With the side-table UPDATE it is the bare set-based UPDATE
  of the same rows the first pass writes (its revisions, inserted too, are not counted).
* **bare UPDATE, side table, salience computed from the wide rows** — the pass's salience work as
  one set-based statement: `UPDATE memories_memorysalience SET salience = <the salience SQL> FROM
  memories_memory` over every live memory (no batches, locks, tolerance or tombstones). Shown next
  to the strict baseline above, never instead of it.
* **bare SELECT, wide table (read floor)** — one statement computing every live memory's salience
  from the wide rows, writing nothing: the least any pass must do, since its inputs live there.
* **decay pass, every row rewritten** — the pass again with tolerance 0, so it rewrites every side
  row, like the bare UPDATE (same table state: both right after a VACUUM).
* **decay pass (next day)** — a day later with the default tolerance: rows whose salience barely
  moved are not rewritten; what the hourly/daily beat run costs in steady state.
* **per-row Python loop** — fetch a memory, compute salience in Python, upsert its side row by id,
  for a 10,000-row sample (what the house style forbids), extrapolated to N.
* **bare UPDATE, wide row (reference)** — `UPDATE memories_memory SET stability = stability` over
  the same live rows: what writing one float per row into the wide row (the design before the side
  table, which also had a salience column there) costs at the least. Measured last, so its dead
  tuples do not slow the other figures.

Goals: a full pass under 60 s, and within 3x of a bare set-based UPDATE of the same rows.
Checked for the first pass (vs both bare UPDATEs above), the pass rewriting every side row and the
next day's pass (vs the side-table UPDATE, which rewrites all the side rows the first pass wrote,
while the later passes only visit the memories still live; and vs the one-statement UPDATE).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import bench_environment, log, print_table
from bench.synthetic import bulk_load_memories, create_bench_stacks

COLUMNS = ("what", "rows", "seconds", "rows_per_s", "x_bare", "written", "forgotten", "extrapolated_s")


def figure(what: str, rows: int, seconds: float, bare: float | None, **extra: Any) -> dict[str, Any]:
    values: dict[str, Any] = {"what": what, "rows": rows, "seconds": seconds, "rows_per_s": rows / seconds,
                              "x_bare": seconds / bare if bare else 1.0, **extra}
    return {column: values.get(column, "") for column in COLUMNS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--stacks", type=int, default=1_000)
    parser.add_argument("--sample", type=int, default=10_000, help="rows for the per-row Python loop")
    parser.add_argument("--batch-size", type=int, default=10_000)
    parser.add_argument("--days-back", type=int, default=365, help="memories are created up to this many days ago")
    parser.add_argument("--workers", type=int, default=None, help="connections the pass uses (default: the service's)")
    args = parser.parse_args()
    load_before = os.getloadavg()

    with bench_environment("decay"):
        from django.db import connection, transaction

        from memories.lifecycle.decay import DecayState, salience, salience_sql
        from memories.lifecycle.decay_pass import _DECAY_BATCH_TABLE_SQL, _DECAY_READ_SQL, DECAY_WORKERS, decay_pass
        from memories.lifecycle.reviews import _store_salience
        from memories.models import Memory

        stacks = create_bench_stacks(args.stacks)
        per_stack = max(1, args.rows // len(stacks))
        log(f"loading {per_stack * len(stacks):,} memories into {len(stacks):,} stacks")
        rows = bulk_load_memories([(s.pk, per_stack) for s in stacks], days_back=args.days_back)

        def sql(statement: str, params: Any = None) -> int:
            with connection.cursor() as cursor:
                cursor.execute(statement, params)
                return cursor.rowcount

        workers = args.workers or DECAY_WORKERS

        def timed_pass(when: datetime, **options: Any) -> tuple[float, dict[str, Any]]:
            t0 = time.monotonic()
            run = decay_pass(now=when, batch_size=args.batch_size, workers=workers, **options)
            return time.monotonic() - t0, run.counts

        # A freshly COPYed table: VACUUM sets hint bits and the visibility map once, so no measured
        # statement pays for that (it would dirty every page of whichever ran first).
        t0 = time.monotonic()
        sql("VACUUM (ANALYZE) memories_memory")
        log(f"vacuumed the memory table in {time.monotonic() - t0:.1f}s")
        sizes = {}
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_size_pretty(pg_table_size('memories_memory')), "
                           "pg_size_pretty(pg_indexes_size('memories_memory'))")
            sizes["memory table / indexes"] = cursor.fetchone()

        now = datetime.now(UTC)
        with transaction.atomic(), connection.cursor() as cursor:  # show how one batch reads
            cursor.execute(_DECAY_BATCH_TABLE_SQL)
            cursor.execute("EXPLAIN " + _DECAY_READ_SQL,
                           {"low": "(0,0)", "high": "(600,0)", "low_block": 0, "high_block": 600, "now": now,
                            "tolerance": 0.005})
            plan = [r[0].strip() for r in cursor.fetchall()]
            transaction.set_rollback(True)
        log("batch plan: " + " | ".join(line.split("  (")[0] for line in plan
                                        if "Scan" in line and "CTE Scan" not in line))

        # 0. The read floor: one set-based SELECT computing every live memory's salience (what any
        # pass must at least do, since its inputs live in the wide row); no writes.
        t0 = time.monotonic()
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT count(*), sum({salience_sql('m', '%(now)s')}) FROM memories_memory m "
                           "WHERE m.forgotten_at IS NULL AND m.deleted_at IS NULL", {"now": now})
            read_rows = int(cursor.fetchone()[0])
        read_floor = time.monotonic() - t0
        log(f"bare SELECT of salience over the wide table: {read_floor:.1f}s")

        # 1. The first pass: every live memory gets its side row.
        first, counts = timed_pass(now)
        log(f"decay pass (first): {first:.1f}s {counts}")
        first_counts = counts

        # 2. THE baseline: a bare UPDATE of every row the pass wrote, on the same kind of table state
        # the full rewrite below sees (right after a VACUUM).
        sql("VACUUM (ANALYZE) memories_memorysalience")
        t0 = time.monotonic()
        bare_rows = sql("UPDATE memories_memorysalience SET salience = salience * 0.999, computed_at = %s",
                        [now])
        bare = time.monotonic() - t0
        log(f"bare UPDATE of the side table: {bare:.1f}s ({bare_rows:,} rows)")
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_size_pretty(pg_table_size('memories_memorysalience')), "
                           "pg_size_pretty(pg_indexes_size('memories_memorysalience'))")
            sizes["side table / index"] = cursor.fetchone()

        # 2b. The other half of what the first pass wrote: its tombstones, as one bare UPDATE of the
        # same rows and columns (forgotten_at stays set, so like the pass it adds no entry to the
        # live-only indexes), after the same kind of VACUUM the pass had before it.
        sql("VACUUM memories_memory")
        t0 = time.monotonic()
        bare_tombstone_rows = sql(
            "UPDATE memories_memory SET forgotten_at = %s, forgotten_reason = 'salience_decay', version = version + 1, "
            "change_seq = nextval('memories_change_seq'), server_updated_at = %s "
            "WHERE forgotten_reason = 'salience_decay' AND forgotten_at IS NOT NULL", [now, now])
        bare_tombstone = time.monotonic() - t0
        log(f"bare UPDATE of the tombstoned wide rows: {bare_tombstone:.1f}s ({bare_tombstone_rows:,} rows)")
        bare_same_rows = bare + bare_tombstone
        sql("VACUUM memories_memory")

        # 2c. One bare statement doing the pass's salience work for the live rows: compute every live
        # memory's salience from its wide row and UPDATE its side row (no batches, no tolerance, no
        # tombstones, no locks). Reported next to the strict side-table baseline, not instead of it.
        sql("VACUUM memories_memorysalience")
        t0 = time.monotonic()
        bare_computed_rows = sql(
            f"UPDATE memories_memorysalience ms SET salience = {salience_sql('m', '%(now)s')}, "
            "computed_at = %(now)s FROM memories_memory m WHERE m.id = ms.memory_id "
            "AND m.forgotten_at IS NULL AND m.deleted_at IS NULL", {"now": now})
        bare_computed = time.monotonic() - t0
        log(f"bare UPDATE of the side table computing salience from the wide rows: {bare_computed:.1f}s "
            f"({bare_computed_rows:,} rows)")

        # 3. The pass rewriting every side row (tolerance 0), after the same VACUUM.
        sql("VACUUM memories_memorysalience")
        rewrite, rewrite_counts = timed_pass(now + timedelta(hours=1), tolerance=0.0)
        log(f"decay pass, every row rewritten: {rewrite:.1f}s {rewrite_counts}")

        # 4. The next day's pass (steady state).
        sql("VACUUM memories_memorysalience")
        next_day, next_counts = timed_pass(now + timedelta(days=1))
        log(f"decay pass (next day): {next_day:.1f}s {next_counts}")

        # 5. The per-row Python loop over a sample, extrapolated.
        fields = ["id", *DecayState.__dataclass_fields__]
        sample_ids = list(Memory.objects.filter(forgotten_at__isnull=True).values_list("id", flat=True)
                          [: args.sample])
        later = now + timedelta(days=2)
        t0 = time.monotonic()
        for memory_id in sample_ids:
            memory = Memory.objects.only(*fields).get(pk=memory_id)
            _store_salience(memory_id=memory_id, value=salience(DecayState.of(memory), later), at=later)
        loop = time.monotonic() - t0
        loop_rate = len(sample_ids) / loop
        log(f"per-row loop: {loop:.1f}s for {len(sample_ids):,} rows")

        # 6. Reference: writing salience into the wide row instead (the previous design's floor).
        t0 = time.monotonic()
        wide_rows = sql("UPDATE memories_memory SET stability = stability "
                        "WHERE forgotten_at IS NULL AND deleted_at IS NULL")
        wide = time.monotonic() - t0
        log(f"bare UPDATE of the wide row: {wide:.1f}s ({wide_rows:,} rows)")

        load_after = os.getloadavg()
        figures = [
            figure("decay pass (first, after import; x_bare: vs both bare UPDATEs)", first_counts["scanned"], first,
                   bare_same_rows, written=first_counts["updated"], forgotten=first_counts["forgotten"]),
            figure("bare UPDATE, side table (baseline)", bare_rows, bare, None),
            figure("bare UPDATE, the tombstoned wide rows", bare_tombstone_rows, bare_tombstone, bare),
            figure("both bare UPDATEs: the rows the first pass writes", bare_rows + bare_tombstone_rows,
                   bare_same_rows, bare),
            figure("bare UPDATE, side table, salience computed from the wide rows", bare_computed_rows,
                   bare_computed, bare),
            figure("bare SELECT of salience, wide table (read floor)", read_rows, read_floor, bare),
            figure("decay pass, every side row rewritten", rewrite_counts["scanned"], rewrite, bare,
                   written=rewrite_counts["updated"], forgotten=rewrite_counts["forgotten"]),
            figure("decay pass (next day)", next_counts["scanned"], next_day, bare,
                   written=next_counts["updated"], forgotten=next_counts["forgotten"]),
            figure(f"per-row Python loop ({len(sample_ids):,} rows)", len(sample_ids), loop, None,
                   x_bare=(rows / loop_rate) / bare, extrapolated_s=rows / loop_rate),
            figure("bare UPDATE, wide memory row (reference)", wide_rows, wide, bare),
        ]
        print_table(f"decay over {rows:,} memories ({len(stacks):,} stacks, batch {args.batch_size:,}, "
                    f"{workers} workers); x_bare: vs the side-table UPDATE unless noted", figures)
        for name, (table, index) in sizes.items():
            print(f"{name}: {table} / {index}")
        print(f"load average (1/5/15 min): before {load_before[0]:.2f}/{load_before[1]:.2f}/{load_before[2]:.2f}, "
              f"after {load_after[0]:.2f}/{load_after[1]:.2f}/{load_after[2]:.2f} (2 cores)")

        def verdict(ok: bool) -> str:
            return "met" if ok else "NOT met"

        print("\ngoal: a full pass < 60 s and within 3x of a bare set-based UPDATE of the same rows")
        print(f"  first pass after import: {first:.1f} s ({verdict(first < 60)}); "
              f"{first / bare_same_rows:.2f}x the bare UPDATEs of the rows it writes "
              f"({verdict(first / bare_same_rows <= 3)}); {first / bare:.2f}x the side-table UPDATE alone")
        print(f"  pass rewriting every side row: {rewrite:.1f} s ({verdict(rewrite < 60)}); "
              f"{rewrite / bare:.2f}x the side-table UPDATE of the same rows ({verdict(rewrite / bare <= 3)}); "
              f"{rewrite / bare_computed:.2f}x the one-statement UPDATE computing them "
              f"({verdict(rewrite / bare_computed <= 3)})")
        print(f"  next day's pass: {next_day:.1f} s ({verdict(next_day < 60)}); "
              f"{next_day / bare:.2f}x the side-table UPDATE ({verdict(next_day / bare <= 3)}); "
              f"{next_day / bare_computed:.2f}x the one-statement UPDATE computing salience "
              f"({verdict(next_day / bare_computed <= 3)})")
        print(f"  first pass vs the bare UPDATE of the wide row (previous design): {first / wide:.2f}x")


if __name__ == "__main__":
    main()
