"""What the soak measures of the service and how it reports it (bench/soak.py has the whole story):
the runner's processes by role with their RSS and CPU, /metrics, the embedding backlog, the writes
found stored, and the soak's report with its goals.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
if str(BASE_DIR) not in sys.path:
    sys.path.insert(0, str(BASE_DIR))

import httpx  # noqa: E402
import psutil  # noqa: E402

from bench.harness import percentiles, print_table  # noqa: E402
from bench.soak_agents import BULK_PUSH, MIX, LivePage, Recorder  # noqa: E402
from memoryhub.worker_priority import AWAITING_VECTORS  # noqa: E402


def service_processes(runner_pid: int) -> dict[str, list[psutil.Process]]:
    """The runner's children by role, each with the processes it started (prefork children, backends)."""
    roles: dict[str, list[psutil.Process]] = {}
    for child in psutil.Process(runner_pid).children():
        cmd = " ".join(child.cmdline())
        if "uvicorn" in cmd:
            role = "web"
        elif "celery" in cmd and " worker " in cmd:
            role = "worker"
        elif "celery" in cmd and " beat " in cmd:
            role = "beat"
        elif cmd.split(" ", 1)[0].endswith("/postgres"):
            role = "postgres"
        elif "redis-server" in cmd:
            role = "redis"
        else:
            continue
        roles[role] = [child, *child.children(recursive=True)]
    return roles


def rss_snapshot(runner_pid: int) -> dict[str, float]:
    """MB per long-lived process; PostgreSQL's backends (they come and go with the pools) as one sum."""
    sizes: dict[str, float] = {}
    for role, procs in service_processes(runner_pid).items():
        for n, proc in enumerate(procs):
            try:
                rss = proc.memory_info().rss / 2**20
            except psutil.Error:
                continue
            if role == "postgres" and n > 0:
                sizes["postgres backends (sum)"] = sizes.get("postgres backends (sum)", 0.0) + rss
            else:
                sizes[role if n == 0 else f"{role} child {n}"] = rss
    return sizes


def cpu_seconds(runner_pid: int) -> dict[str, float]:
    """user+system CPU seconds so far per role, children included (from /proc through psutil)."""
    spent: dict[str, float] = {}
    for role, procs in service_processes(runner_pid).items():
        total = 0.0
        for proc in procs:
            try:
                times = proc.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
        spent[role] = total
    return spent


def scrape_metrics(base_url: str) -> dict[str, float]:
    """Totals of a few counters from /metrics (loopback needs no token)."""
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    totals: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        match = re.match(r"^(memoryhub_[a-z_]+?)(?:_total)?(?:\{[^}]*\})? ([0-9.e+-]+)$", line)
        if match and not line.startswith(("memoryhub_http_request_duration", "memoryhub_search_duration",
                                          "memoryhub_job_duration", "memoryhub_time_to_searchable")):
            totals[match.group(1)] += float(match.group(2))
    return dict(totals)


_SEARCHABLE_BUCKET = re.compile(r'^memoryhub_time_to_searchable_seconds_bucket\{[^}]*le="([^"]+)"[^}]*\} ([0-9.e+-]+)$')


def searchable_buckets(base_url: str) -> dict[float, float]:
    """The cumulative counts of /metrics' `memoryhub_time_to_searchable_seconds` histogram, by upper
    bound (this host's processes added up)."""
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    counts: dict[float, float] = defaultdict(float)
    for line in text.splitlines():
        if match := _SEARCHABLE_BUCKET.match(line):
            counts[float(match.group(1))] += float(match.group(2))
    return dict(counts)


def histogram_quantile(before: dict[float, float], after: dict[float, float], q: float) -> tuple[float, int]:
    """The `q` quantile of what a cumulative histogram observed between two scrapes, interpolated
    inside its bucket as Prometheus' `histogram_quantile` does, and how many observations that was."""
    bounds = sorted(after)
    counts = [after[bound] - before.get(bound, 0.0) for bound in bounds]
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return float("nan"), 0
    rank, lower, below = q * total, 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= rank:
            if math.isinf(bound):
                return lower, int(total)  # past the last finite bucket: its bound is all it can say
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-9), int(total)
        lower, below = bound, count
    return lower, int(total)


def backlog(database_url: str) -> int:
    import psycopg

    with psycopg.connect(database_url) as conn:
        row = conn.execute(f"SELECT count(*) {AWAITING_VECTORS}").fetchone()
    return int(row[0]) if row else 0


def average_stack_size(database_url: str) -> float:
    """Memories a stack holds on average now (the stacks' own counters)."""
    import psycopg

    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT avg(memory_count) FROM stacks_stack").fetchone()
    return float(row[0]) if row and row[0] is not None else 0.0


def vector_models(database_url: str) -> str:
    """The models the stored vectors were made with, and how many each: a service that fell back
    from the ONNX export to torch (a checkout without `build/`) shows here as another model id."""
    import psycopg

    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT embedding_model, count(*) FROM memories_memory WHERE embedding IS NOT NULL "
                            "GROUP BY 1 ORDER BY 2 DESC").fetchall()
    return ", ".join(f"{model or '?'} ({n:,})" for model, n in rows) or "none yet"


def drain(database_url: str, limit: float) -> tuple[float, int]:
    """Wait, up to `limit` seconds, for the embedding backlog to drain: how long it took, and what
    was left (0: drained)."""
    started = time.monotonic()
    while (left := backlog(database_url)) > 0 and time.monotonic() - started < limit:
        time.sleep(1)
    return time.monotonic() - started, left


def cores_used(before: dict[str, float], after: dict[str, float], own_before: Any, own_after: Any,
               elapsed: float) -> dict[str, float]:
    """CPU seconds per second of each role over a stretch, and of this load generator itself (it
    shares the machine: cores it burns are cores the service does not get)."""
    used = {role: (after[role] - before.get(role, 0.0)) / elapsed for role in sorted(after)}
    used["load generator"] = (own_after.user + own_after.system - own_before.user - own_before.system) / elapsed
    return used


def capacity_line(cores: dict[str, float], written_per_s: float, stored_per_s: float) -> str:
    """The cores this load would need for the embedding to keep up: what the service used, with the
    worker's share scaled from the vectors it stored to the memories the agents wrote
    (docs/production.md §3). Over the machine's cores, no setting makes the goals hold: the machine is too small."""
    if stored_per_s <= 0:
        return "CPU this load needs: unknown (no vector stored during the soak)"
    per_vector = cores.get("worker", 0.0) / stored_per_s
    service = {role: used for role, used in cores.items() if role not in ("worker", "load generator")}
    needed = sum(service.values()) + written_per_s * per_vector
    return (f"CPU this load needs for the embedding to keep up (cores, of {psutil.cpu_count()}): "
            + " + ".join(f"{role} {used:.2f}" for role, used in service.items() if used >= 0.005)
            + f" + embedding {written_per_s:.0f} memories/s x {1000 * per_vector:.1f} ms = {needed:.2f}"
            f" (and this load generator's {cores.get('load generator', 0.0):.2f})")


def stored_counts(database_url: str, record_ids: list[str]) -> Counter[str]:
    """How many rows hold each of `record_ids`, by one pass over the table's record ids. WHY not a
    join with the ids: right after a soak or a flood the table's statistics are stale (the rows it
    wrote, nobody analysed yet), and the planner's nested loop over them ran for minutes, with the
    embedding backlog draining beside it."""
    import psycopg

    wanted, counts = set(record_ids), Counter[str]()
    with psycopg.connect(database_url) as conn, conn.cursor(name="bench_record_ids") as cursor:
        cursor.itersize = 50_000
        cursor.execute("SELECT record_id FROM memories_memory")
        counts.update(rid for (rid,) in cursor if rid in wanted)
    return counts


def where_the_time_went(samples: list[Any]) -> dict[str, dict[str, float]] | None:
    """The slowest 5 % of one operation's `samples` against its fastest half, split by the service's
    own Server-Timing (memoryhub.timing): its thread's CPU, its database statements, the rest of its
    time waiting inside the service (for a core, the GIL, Redis), and what the client waited outside
    it (the HTTP server, the network, the load generator). Means, in ms; None under 20 timed 2xx."""
    timed = sorted((s for s in samples if 200 <= s.status < 300 and s.served), key=lambda s: s.ms)
    if len(timed) < 20:
        return None
    split: dict[str, dict[str, float]] = {}
    for label, part in (("slow", timed[int(len(timed) * 0.95):]), ("fast half", timed[:len(timed) // 2])):
        client = sum(s.ms for s in part) / len(part)
        app, cpu, db = (sum(s.served[i] for s in part) / len(part) for i in range(3))
        split[label] = {"client": client, "cpu": cpu, "db": db, "waiting": app - cpu - db, "outside": client - app}
    return split


def split_columns(split: dict[str, dict[str, float]]) -> dict[str, float]:
    """`where_the_time_went`'s split as one table row's columns ("slow: cpu", …)."""
    return {f"{label}: {part}": ms for label, parts in split.items() for part, ms in parts.items()}


def print_where_the_time_went(loaded: dict[str, list[Any]]) -> None:
    """`where_the_time_went` for each operation of the soak."""
    rows = []
    for op in [*MIX.weights, BULK_PUSH]:
        split = where_the_time_went(loaded.get(op, []))
        if split is not None:
            rows.append({"operation": op, **split_columns(split)})
    if rows:
        print_table("where the time went: the slowest 5 % of each operation (slow) and its fastest half, "
                    "ms, means; cpu, db and waiting are inside the service (its Server-Timing), outside is "
                    "the rest of what the client waited", rows)


def unloaded_split(samples: list[Any]) -> dict[str, float] | None:
    """Medians of one operation's unloaded 2xx `samples`: what the client waited, and from the
    service's Server-Timing its whole time (app), its thread's CPU and its database statements
    (which overlap: a statement's client-side work is CPU too). None when no sample carried the header."""
    timed = [s for s in samples if 200 <= s.status < 300 and s.served]
    if not timed:
        return None
    return {"client": percentiles([s.ms for s in timed])["p50"],
            **{part: percentiles([s.served[n] for s in timed])["p50"] for n, part in enumerate(("app", "cpu", "db"))}}


def print_growth_split(quiet: dict[str, list[Any]], quiet_after: dict[str, list[Any]], seeded: int,
                       grown: float) -> None:
    """Each operation's unloaded cost on the seeded stacks against the stacks the soak grew: which
    part of a request the growth moved (the database's scans, or the service's own CPU)."""
    rows = []
    for op in MIX.weights:
        before, after = unloaded_split(quiet.get(op, [])), unloaded_split(quiet_after.get(op, []))
        if before is not None and after is not None:
            rows.append({"operation": op, **{f"seeded: {k}": v for k, v in before.items()},
                         **{f"grown: {k}": v for k, v in after.items()}})
    if rows:
        print_table(f"unloaded, one request at a time: stacks of {seeded} memories (seeded) against "
                    f"~{grown:,.0f} (grown by the soak), ms, medians; cpu and db are the service's "
                    "Server-Timing", rows)


def report_soak(args: argparse.Namespace, recorder: Recorder, baseline: Recorder, pages: list[LivePage],
                elapsed: float, rss: dict[str, dict[str, float]], backlogs: dict[str, int],
                metrics: dict[str, dict[str, float]], stored: Counter[str], after: Recorder,
                searchable: dict[str, dict[float, float]], drained: tuple[float, int]) -> bool:
    loaded, quiet, quiet_after = recorder.by_op(), baseline.by_op(), after.by_op()

    def ok_ms(samples: list[Any]) -> list[float]:
        return [s.ms for s in samples if 200 <= s.status < 300]

    rows, goals = [], []
    for op in [*MIX.weights, BULK_PUSH]:
        samples = loaded.get(op, [])
        ok = ok_ms(samples)
        figures, start, end = percentiles(ok), percentiles(ok_ms(quiet.get(op, []))), percentiles(
            ok_ms(quiet_after.get(op, [])))
        rows.append({"operation": op, "requests": len(samples), "per s": len(samples) / elapsed,
                     "2xx": len(ok), "p50 ms": figures["p50"], "p95 ms": figures["p95"], "p99 ms": figures["p99"],
                     "unloaded p50": start["p50"], "unloaded p95": start["p95"],
                     "p95 / unloaded": figures["p95"] / start["p95"] if start["n"] else float("nan"),
                     "unloaded p95, grown stacks": end["p95"] if end["n"] else float("nan"),
                     # the same answers timed from when this process actually sent them
                     "p95 from send": percentiles([s.ms - s.late_ms for s in samples if 200 <= s.status < 300])["p95"]})
        if op != BULK_PUSH:  # the bulk lane may be slower: reported, no goal
            goals.append((f"{op}: p95 {figures['p95']:.0f} ms <= 3x unloaded p95 {start['p95']:.0f} ms",
                          figures["p95"] <= 3 * start["p95"]))
    total = len(recorder.samples)
    print_table(f"soak: {args.agents} agents, {elapsed:.0f} s, open loop (an operation every 1-2 s each); "
                f"{total:,} requests = {total / elapsed:.1f}/s", rows)
    print_where_the_time_went(loaded)
    # Latency over the run, in tenths: a slow start (the seed's embedding backlog) or a worsening
    # (the stacks grow) shows here, not in the run's one p95.
    started = min((s.started for s in recorder.samples), default=0.0)
    tenths: dict[int, list[float]] = defaultdict(list)
    for sample in recorder.samples:
        if 200 <= sample.status < 300:
            tenths[min(9, int(10 * (sample.started - started) / elapsed))].append(sample.ms)
    print("\np95 of all operations by tenth of the run (ms): "
          + ", ".join(f"{percentiles(tenths[n])['p95']:.0f}" for n in range(10)))
    lag, late = percentiles(recorder.loop_lag_ms), percentiles([s.late_ms for s in recorder.samples])
    print(f"\nload generator (one process on the same cores): event-loop lag p50 {lag['p50']:.1f} / p95 "
          f"{lag['p95']:.1f} / p99 {lag['p99']:.1f} ms; operations started late by p50 {late['p50']:.1f} / p95 "
          f"{late['p95']:.1f} ms (counted in the figures above: latency runs from the scheduled start)")
    statuses = Counter(s.status for s in recorder.samples if not 200 <= s.status < 300)
    print("\nnon-2xx by status (0 = no answer): "
          + (", ".join(f"{status}: {n}" for status, n in sorted(statuses.items())) or "none"))
    for status in sorted(statuses):
        example = next(s for s in recorder.samples if s.status == status)
        print(f"  e.g. {status} on {example.op}: {example.error}")
    # Requests without an answer by error: those that failed while their client still waited, and
    # those the soak's own close cut off.
    unanswered = {cut: Counter(s.error for s in recorder.samples if s.status == 0 and recorder.cut_off(s) == cut)
                  for cut in (False, True)}
    for label, cut in (("while the load ran", False), ("cut off at its end", True)):
        if unanswered[cut]:
            print(f"  no answer {label}: "
                  + ", ".join(f"{error} {n:,}" for error, n in unanswered[cut].most_common()))
    print_table("RSS per process (MB)", [{"process": name, "start": rss["start"].get(name, float("nan")),
                                          "middle": rss["middle"].get(name, float("nan")),
                                          "end": rss["end"].get(name, float("nan"))} for name in rss["end"]])
    print(f"\nembedding backlog: start {backlogs['start']:,}, middle {backlogs['middle']:,}, end {backlogs['end']:,}; "
          f"lag at the end (/metrics: the oldest change still awaiting a vector) "
          f"{metrics['end'].get('memoryhub_embedding_lag_seconds', 0.0):,.0f} s")
    drain_seconds, left = drained
    print(f"after the load: the backlog of {backlogs['end']:,} "
          + (f"drained in {drain_seconds:.0f} s" if not left else f"still {left:,} after {drain_seconds:.0f} s"))
    p50, vectors = histogram_quantile(searchable["start"], searchable["end"], 0.50)
    p95, _ = histogram_quantile(searchable["start"], searchable["end"], 0.95)
    print(f"time to searchable of the soak's writes (acknowledged write -> vector stored, up to the drain's end; "
          f"/metrics' histogram, "
          f"{vectors:,} vectors): p50 {p50:.1f} s, p95 {p95:.1f} s")
    print(f"live pages: {sum(p.events for p in pages):,} change events received by {len(pages)} pages; "
          f"closed early: {sum(bool(p.closed_early) for p in pages)} "
          f"{next((p.closed_early for p in pages if p.closed_early), '')}")
    moved = {name: metrics["end"].get(name, 0.0) - metrics["start"].get(name, 0.0) for name in sorted(metrics["end"])}
    print("/metrics counters moved during the soak: "
          + ", ".join(f"{name.removeprefix('memoryhub_')} +{value:,.0f}" for name, value in moved.items() if value))

    acknowledged = recorder.acknowledged
    lost = sum(1 for rid in acknowledged if stored[rid] == 0)
    duplicated = sum(1 for rid in acknowledged if stored[rid] > 1) + (len(acknowledged) - len(set(acknowledged)))
    # As bench/flood.py counts them: every request answered, and no 5xx but a 503 that says when to
    # come back (bulk work deferred, which a real client retries after waiting).
    no_answer, cut_off = unanswered[False].total(), unanswered[True].total()
    bad_5xx = sum(1 for s in recorder.samples if s.status >= 500 and not (s.status == 503 and s.retry_after))
    deferred = sum(1 for s in recorder.samples if s.status == 503 and s.retry_after)
    grown = {name: rss["end"][name] / rss["middle"][name] - 1 for name in rss["end"]
             if name in rss["middle"] and not name.startswith("postgres backends") and rss["middle"][name] > 0}
    worst = max(grown.items(), key=lambda item: item[1]) if grown else ("-", 0.0)
    goals = [(f"every request answered, no 5xx but 503 with Retry-After: no answer {no_answer:,}, other 5xx "
              f"{bad_5xx:,} (503 with Retry-After: {deferred:,}; still waiting when the load generator stopped, "
              f"cut off: {cut_off:,})", no_answer == 0 and bad_5xx == 0),
             (f"acknowledged writes {len(acknowledged):,}: lost {lost}, duplicated {duplicated}",
              lost == 0 and duplicated == 0),
             *goals,
             (f"RSS growth over the second half: worst {worst[0]} {worst[1]:+.1%}", worst[1] <= 0.20),
             (f"embedding backlog drained once the load ended ({backlogs['end']:,} -> {left:,} in "
              f"{drain_seconds:.0f} s; over the second half {backlogs['middle']:,} -> {backlogs['end']:,})", left == 0)]
    print("\nGoals:")
    for text, passed in goals:
        print(f"  {'PASS' if passed else 'FAIL'}  {text}")
    return all(passed for _, passed in goals)
