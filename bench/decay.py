"""Decay pass speed: one full pass over N memories, next to baselines measured in the same run.

    .venv/bin/python bench/decay.py                 # 1,000,000 memories (the goal size)
    .venv/bin/python bench/decay.py --rows 100000   # a quicker run

Figures printed:

* **bare UPDATE** — `UPDATE memories_memory SET salience = 0.5` over the same live rows, one
  statement: the floor for rewriting every row once.
* **decay pass (first)** — `memories.lifecycle.decay_pass` over the same rows: salience for every
  row, tombstones below the threshold, revisions for the tombstones, bounded batches with one
  transaction each, JobRun bookkeeping.
* **decay pass (next day)** — the same pass a day later: rows whose salience barely moved are not
  rewritten, so this is what the hourly/daily beat run costs in steady state.
* **vacuumed table** — every row rewritten once more (decay pass with tolerance ~0, and a bare
  UPDATE) after VACUUM left free space in the pages, so updates can stay on their page (HOT).
* **per-row Python loop** — fetch a row, compute salience in Python, UPDATE it by id, for a
  10,000-row sample (what the house style forbids), extrapolated to N.

Goals (issue 7): the full pass under 60 s, and within 3x of the bare UPDATE. Both tables are
compacted (VACUUM FULL) before each full rewrite so neither pass gets the other's free space.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import bench_environment, bulk_load_memories, create_bench_stacks, log, print_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--stacks", type=int, default=1_000)
    parser.add_argument("--sample", type=int, default=10_000, help="rows for the per-row Python loop")
    parser.add_argument("--batch-size", type=int, default=10_000)
    parser.add_argument("--days-back", type=int, default=365, help="memories are created up to this many days ago")
    args = parser.parse_args()

    with bench_environment("decay"):
        from django.db import connection

        from memories import lifecycle
        from memories.decay import DecayState, salience

        stacks = create_bench_stacks(args.stacks)
        per_stack = max(1, args.rows // len(stacks))
        log(f"loading {per_stack * len(stacks):,} memories into {len(stacks):,} stacks")
        rows = bulk_load_memories([(s.pk, per_stack) for s in stacks], days_back=args.days_back)

        def sql(statement: str) -> None:
            with connection.cursor() as cursor:
                cursor.execute(statement)

        def compact() -> None:
            t0 = time.monotonic()
            sql("VACUUM FULL memories_memory")
            sql("ANALYZE memories_memory")
            log(f"compacted the table in {time.monotonic() - t0:.1f}s")

        figures = []

        # 1. The bare set-based UPDATE: the floor for rewriting every row once.
        compact()
        t0 = time.monotonic()
        with connection.cursor() as cursor:
            cursor.execute("UPDATE memories_memory SET salience = 0.5 "
                           "WHERE forgotten_at IS NULL AND deleted_at IS NULL")
            bare_rows = cursor.rowcount
        bare = time.monotonic() - t0
        figures.append({"what": "bare UPDATE (1 statement)", "rows": bare_rows, "seconds": bare,
                        "rows_per_s": bare_rows / bare, "x_bare": 1.0})
        log(f"bare UPDATE: {bare:.1f}s")

        # 2. The decay pass on the same rows, same table state.
        sql("UPDATE memories_memory SET salience = NULL")  # so the pass writes every row, like the bare one
        compact()
        now = datetime.now(UTC)
        with connection.cursor() as cursor:  # show how one batch reads the table
            cursor.execute("EXPLAIN " + lifecycle._DECAY_BATCH_SQL,
                           {"low": "(0,0)", "high": "(600,0)", "now": now, "tolerance": 0.005})
            scans = [r[0].strip() for r in cursor.fetchall() if "Scan" in r[0] and "CTE Scan" not in r[0]]
        log("batch plan: " + " | ".join(line.split("  (")[0] for line in scans))
        t0 = time.monotonic()
        run = lifecycle.decay_pass(now=now, batch_size=args.batch_size)
        first = time.monotonic() - t0
        figures.append({"what": "decay pass (first)", "rows": run.counts["scanned"], "seconds": first,
                        "rows_per_s": run.counts["scanned"] / first, "x_bare": first / bare,
                        "written": run.counts["updated"], "forgotten": run.counts["forgotten"]})
        log(f"decay pass: {first:.1f}s {run.counts}")

        # 3. The next day's pass (steady state).
        sql("VACUUM memories_memory")
        t0 = time.monotonic()
        run = lifecycle.decay_pass(now=now + timedelta(days=1), batch_size=args.batch_size)
        second = time.monotonic() - t0
        figures.append({"what": "decay pass (next day)", "rows": run.counts["scanned"], "seconds": second,
                        "rows_per_s": run.counts["scanned"] / second, "x_bare": second / bare,
                        "written": run.counts["updated"], "forgotten": run.counts["forgotten"]})
        log(f"next-day pass: {second:.1f}s {run.counts}")

        # 3b. Every row rewritten again (tolerance ~0) once VACUUM has left free space in the pages:
        # the updates can stay on their page (HOT) and skip the index inserts, next to a bare
        # UPDATE on the same kind of table.
        sql("VACUUM memories_memory")
        t0 = time.monotonic()
        run = lifecycle.decay_pass(now=now + timedelta(days=3), batch_size=args.batch_size, tolerance=1e-9)
        rewrite = time.monotonic() - t0
        sql("VACUUM memories_memory")
        t0 = time.monotonic()
        with connection.cursor() as cursor:
            cursor.execute("UPDATE memories_memory SET salience = salience + 0.0 "
                           "WHERE forgotten_at IS NULL AND deleted_at IS NULL")
            hot_rows = cursor.rowcount
        hot_bare = time.monotonic() - t0
        figures.append({"what": "bare UPDATE, vacuumed table", "rows": hot_rows, "seconds": hot_bare,
                        "rows_per_s": hot_rows / hot_bare, "x_bare": hot_bare / bare})
        figures.append({"what": "decay pass, all rows rewritten, vacuumed", "rows": run.counts["scanned"],
                        "seconds": rewrite, "rows_per_s": run.counts["scanned"] / rewrite, "x_bare": rewrite / bare,
                        "written": run.counts["updated"], "forgotten": run.counts["forgotten"]})
        log(f"full rewrite after VACUUM: {rewrite:.1f}s {run.counts}; bare UPDATE there: {hot_bare:.1f}s")

        # 4. The per-row Python loop over a sample, extrapolated.
        from memories.models import Memory

        fields = ["id", *DecayState.__dataclass_fields__]
        sample_ids = list(Memory.objects.filter(forgotten_at__isnull=True).values_list("id", flat=True)
                          [: args.sample])
        later = now + timedelta(days=2)
        t0 = time.monotonic()
        for memory_id in sample_ids:
            memory = Memory.objects.only(*fields).get(pk=memory_id)
            Memory.objects.filter(pk=memory_id).update(salience=salience(DecayState.of(memory), later))
        loop = time.monotonic() - t0
        loop_rate = len(sample_ids) / loop
        figures.append({"what": f"per-row Python loop ({len(sample_ids):,} rows)", "rows": len(sample_ids),
                        "seconds": loop, "rows_per_s": loop_rate,
                        "x_bare": (rows / loop_rate) / bare, "extrapolated_s": rows / loop_rate})

        print_table(f"decay over {rows:,} memories ({len(stacks):,} stacks, batch {args.batch_size:,})", figures)
        print(f"\ngoal: full pass < 60 s -> {first:.1f} s ({'met' if first < 60 else 'NOT met'}); "
              f"within 3x of the bare UPDATE -> {first / bare:.2f}x ({'met' if first / bare <= 3 else 'NOT met'})")


if __name__ == "__main__":
    main()
