"""Sync throughput: kernle push over HTTP vs. inserting the same rows with psycopg, and pull.

    .venv/bin/python bench/sync.py                      # 100,000 memories, batches of 500, pull of 10,000
    .venv/bin/python bench/sync.py --memories 20000     # a smaller run while developing

What it measures, in one run against real embedded Postgres+pgvector and Redis and the real ASGI
app under uvicorn (one worker, one client, sequential requests — what one agent does):

* **push**: `POST /sync/push` with kernle-shaped operations of every kind (the mix of
  bench/synthetic.py), `--batch` per request — validation, per-stack lock, idempotent upsert,
  revision and counter bookkeeping, embedding jobs queued after commit. Reported as ops/s and
  per-batch latency.
* **baseline**: the same rows inserted straight into `memories_memory` with psycopg
  (`executemany` INSERT, one transaction per batch, same batch size) — and COPY as the floor.
  The push/baseline ratio is the figure to improve.
* **pull**: `POST /sync/pull` returning a complete change set of `--pull` memories (kernle has no
  paging), timed to the last byte received (httpx, gzip as the kernle client negotiates it), with
  the client's JSON parse shown separately; and the native cursor pull of the same stack in pages
  of 1,000 (parsed); next to the baseline of selecting the same rows with psycopg and
  `json.dumps`-ing them.

Goals: push ≥ 5,000 ops/s; a pull of 10,000 changes < 1 s.

`--events-compare` adds **push with change events on vs off** (memories.writes.outbox): a second
server with MEMORYHUB_EVENTS=off runs next to the first, and the same number of operations go to
each in alternating rounds (so both see the same load on a shared box). Goal: on ≥ 0.95x off.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import bench_environment, log, percentiles, print_table, web_server
from bench.synthetic import _KIND_WEIGHTS, KINDS, synthetic_memory

TABLE_FOR_KIND = {"episode": "episodes", "note": "notes", "belief": "beliefs", "value": "agent_values",
                  "goal": "goals", "drive": "drives", "relationship": "relationships", "playbook": "playbooks"}


def make_operations(count: int, *, seed: int, stack_slug: str) -> list[dict[str, Any]]:
    """Kernle-shaped upserts, as `kernle sync push` sends them (full records, nulls included)."""
    rng = random.Random(seed)
    base = datetime(2026, 11, 1, tzinfo=UTC)
    operations = []
    for i in range(count):
        kind = rng.choices(KINDS, _KIND_WEIGHTS)[0]
        _, data = synthetic_memory(rng, kind)
        record_id = str(uuid.UUID(int=rng.getrandbits(128)))
        stamp = (base + timedelta(seconds=i)).isoformat()
        data.update(id=record_id, stack_id=stack_slug, created_at=stamp, local_updated_at=stamp,
                    cloud_synced_at=None, version=1, deleted=False, strength=1.0, tags=[rng.choice(KINDS)],
                    confidence=0.8, source_type="direct_experience", derived_from=None, context_tags=None,
                    epoch_id=None)
        operations.append({"operation": "update", "table": TABLE_FOR_KIND[kind], "record_id": record_id,
                           "local_updated_at": stamp, "version": 1, "data": data})
    return operations


def http_push(base_url: str, secret: str, stack_slug: str, operations: list[dict[str, Any]],
              batch: int) -> tuple[float, list[float]]:
    import httpx

    from accounts.throttles import throttle_state_clear

    bodies = [json.dumps({"stack_id": stack_slug, "operations": operations[i:i + batch]}).encode()
              for i in range(0, len(operations), batch)]
    headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
    latencies = []
    with httpx.Client(base_url=base_url, headers=headers, timeout=120) as client:
        started = time.perf_counter()
        for n, body in enumerate(bodies):
            if n % 50 == 0:
                # The real throttle stays on the path; its 60/min budget is refilled between rounds
                # (outside the request being timed) so the benchmark measures work, not waiting.
                paused = time.perf_counter()
                throttle_state_clear()
                started += time.perf_counter() - paused
            t0 = time.perf_counter()
            response = client.post("/sync/push", content=body)
            latencies.append((time.perf_counter() - t0) * 1000)
            if response.status_code != 200:
                raise RuntimeError(f"push failed: {response.status_code} {response.text[:500]}")
            result = response.json()
            if result["conflicts"]:
                raise RuntimeError(f"unexpected conflicts: {result['conflicts'][:3]}")
        elapsed = time.perf_counter() - started
    return elapsed, latencies


def compare_events(env: Any, secret: str, memories: int, batch: int) -> dict[str, Any]:
    """Push `memories` operations to a fresh server with change events on and as many to one with
    MEMORYHUB_EVENTS=off, one push to each in turn (both see the same moment's load on a shared
    box, and neither has served the rest of the benchmark before); total seconds and per-push
    latencies of each."""
    from stacks.models import Stack

    org_id = Stack.objects.get(slug="push").organization_id
    for slug in ("events-on", "events-off"):
        Stack.objects.create(organization_id=org_id, slug=slug)
    on_ops = make_operations(memories, seed=3, stack_slug="events-on")
    off_ops = make_operations(memories, seed=4, stack_slug="events-off")
    seconds = {"on": 0.0, "off": 0.0}
    latencies: dict[str, list[float]] = {"on": [], "off": []}
    with web_server(env) as on_url, web_server(env, extra_env={"MEMORYHUB_EVENTS": "off"}) as off_url:
        # Warm-up (imports, connections) as for the first server, with records of their own.
        for side, url in (("on", on_url), ("off", off_url)):
            http_push(url, secret, f"events-{side}", make_operations(batch, seed=97, stack_slug=f"events-{side}"),
                      batch)
        for start in range(0, memories, batch):
            for side, url, ops in (("on", on_url, on_ops), ("off", off_url, off_ops)):
                elapsed, one = http_push(url, secret, f"events-{side}", ops[start:start + batch], batch)
                seconds[side] += elapsed
                latencies[side].extend(one)
    # The work measured was done: every push of the "on" side left one event, published (by the
    # server's publisher thread, moments after each response); the "off" side none.
    from memories.models import ChangeEvent

    deadline = time.monotonic() + 10
    on_events = ChangeEvent.objects.filter(stack__slug="events-on", stack__organization_id=org_id)
    while on_events.filter(published_at__isnull=True).exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    pushes = -(-memories // batch) + 1  # and the warm-up's
    assert on_events.count() == pushes and not on_events.filter(published_at__isnull=True).exists()
    assert not ChangeEvent.objects.filter(stack__slug="events-off", stack__organization_id=org_id).exists()
    return {"seconds": seconds, "latencies": latencies}


def baseline_rows(operations: list[dict[str, Any]], stack_pk: int) -> list[tuple[Any, ...]]:
    """The rows a push stores, computed outside the timing (the baseline measures only the insert)."""
    from memories.records.normalize import normalize_memory
    from memories.records.vocabulary import KIND_FOR_TABLE

    now = datetime.now(UTC)
    rows = []
    for op in operations:
        kind = KIND_FOR_TABLE[op["table"]]
        payload = {k: v for k, v in op["data"].items() if k not in ("version", "deleted", "local_updated_at",
                                                                    "cloud_synced_at", "id", "stack_id")}
        m = normalize_memory(kind, payload)
        c = m.columns
        rows.append((uuid.uuid4(), stack_pk, kind, op["record_id"], m.text, json.dumps(m.data), json.dumps(m.extra),
                     c["tags"], c["confidence"], c["source_type"], c["source_entity"], c["derived_from"],
                     c["source_episodes"], c["emotional_valence"], c["emotional_arousal"], c["emotional_tags"],
                     c["subject_ids"], c["access_grants"], c["consent_grants"], c["strength"], c["times_accessed"],
                     c["is_protected"], 1, 1, now, now, c.get("client_updated_at"), m.size_bytes))
    return rows


_BASELINE_COLUMNS = ("id", "stack_id", "kind", "record_id", "text", "data", "extra", "tags", "confidence",
                     "source_type", "source_entity", "derived_from", "source_episodes", "emotional_valence",
                     "emotional_arousal", "emotional_tags", "subject_ids", "access_grants", "consent_grants",
                     "strength", "times_accessed", "is_protected", "version", "client_version", "created_at",
                     "server_updated_at", "client_updated_at", "size_bytes")


def psycopg_insert(database_url: str, rows: list[tuple[Any, ...]], batch: int) -> float:
    import psycopg

    sql = (f"INSERT INTO memories_memory ({', '.join(_BASELINE_COLUMNS)}, stability, difficulty, forgotten_reason, "
           f"embedding_model) VALUES ({', '.join(['%s'] * len(_BASELINE_COLUMNS))}, 1.0, 5.0, '', '')")
    with psycopg.connect(database_url) as conn:
        started = time.perf_counter()
        for i in range(0, len(rows), batch):
            with conn.transaction(), conn.cursor() as cursor:
                cursor.executemany(sql, rows[i:i + batch])
        return time.perf_counter() - started


def psycopg_copy(database_url: str, rows: list[tuple[Any, ...]]) -> float:
    import psycopg

    with psycopg.connect(database_url) as conn:
        started = time.perf_counter()
        with conn.transaction(), conn.cursor() as cursor, cursor.copy(
            f"COPY memories_memory ({', '.join(_BASELINE_COLUMNS)}, stability, difficulty, forgotten_reason, "
            f"embedding_model) FROM STDIN"
        ) as copy:
            for row in rows:
                copy.write_row((*row, 1.0, 5.0, "", ""))
        return time.perf_counter() - started


def time_pulls(base_url: str, secret: str, stack_slug: str, expected: int, repeats: int) -> dict[str, Any]:
    import httpx

    from accounts.throttles import throttle_state_clear

    headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
    kernle_times, parse_times, native_times = [], [], []
    with httpx.Client(base_url=base_url, headers=headers, timeout=120) as client:
        for _ in range(repeats):
            throttle_state_clear()
            t0 = time.perf_counter()
            response = client.post("/sync/pull", content=json.dumps({"stack_id": stack_slug}).encode())
            received = time.perf_counter()
            body = response.json()
            kernle_times.append(received - t0)
            parse_times.append(time.perf_counter() - received)
            if response.status_code != 200 or len(body["operations"]) != expected:
                raise RuntimeError(f"pull returned {response.status_code} / {len(body.get('operations', []))}")
            size = len(response.content)
            t0 = time.perf_counter()
            cursor, got = None, 0
            while True:
                params = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
                page = client.get(f"/api/v1/stacks/{stack_slug}/sync/pull", params=params).json()
                got += len(page["changes"])
                cursor = page["next_cursor"]
                if not page["has_more"]:
                    break
            native_times.append(time.perf_counter() - t0)
            if got != expected:
                raise RuntimeError(f"native pull returned {got}")
    return {"kernle": kernle_times, "parse": parse_times, "native": native_times, "bytes": size}


def psycopg_select(database_url: str, stack_pk: int, repeats: int) -> list[float]:
    import psycopg

    times = []
    with psycopg.connect(database_url) as conn:
        for _ in range(repeats):
            t0 = time.perf_counter()
            with conn.cursor() as cursor:
                cursor.execute("SELECT record_id, kind, data, extra, tags, created_at, server_updated_at "
                               "FROM memories_memory WHERE stack_id = %s AND deleted_at IS NULL "
                               "AND forgotten_at IS NULL ORDER BY change_seq", [stack_pk])
                rows = cursor.fetchall()
            json.dumps([{"record_id": r[0], "kind": r[1], "data": {**r[3], **r[2], "tags": r[4]},
                         "created_at": r[5].isoformat(), "cloud_synced_at": r[6].isoformat()} for r in rows])
            times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--memories", type=int, default=100_000, help="memories to push (default 100,000)")
    parser.add_argument("--batch", type=int, default=500, help="operations per push (default 500)")
    parser.add_argument("--pull", type=int, default=10_000, help="changes in the pulled stack (default 10,000)")
    parser.add_argument("--repeats", type=int, default=5, help="pull repetitions (default 5)")
    parser.add_argument("--events-compare", action="store_true",
                        help="also push with change events on vs off (MEMORYHUB_EVENTS=off), interleaved")
    args = parser.parse_args()

    with bench_environment("sync") as env:
        from accounts.models import Membership, Organization, User
        from accounts.services import api_key_issue
        from stacks.models import Stack

        org = Organization.objects.create(name="Bench sync", slug=f"bench-sync-{uuid.uuid4().hex[:6]}",
                                          tier="unlimited")
        user = User.objects.create_user(username=f"bench-{uuid.uuid4().hex[:6]}")
        # A key needs its owner's access (accounts.services.api_key_issue).
        Membership.objects.create(user=user, organization=org, role=Membership.Role.ADMIN)
        push_stack = Stack.objects.create(organization=org, slug="push")
        baseline_stack = Stack.objects.create(organization=org, slug="baseline")
        copy_stack = Stack.objects.create(organization=org, slug="copy")
        pull_stack = Stack.objects.create(organization=org, slug="pull")
        _, secret = api_key_issue(organization=org, user=user, stack_id=None, name="bench")

        log(f"building {args.memories:,} kernle operations")
        operations = make_operations(args.memories, seed=1, stack_slug="push")
        rows = baseline_rows(operations, baseline_stack.pk)
        copy_rows = [(uuid.uuid4(), copy_stack.pk, *row[2:]) for row in rows]

        load_before = os.getloadavg()
        with web_server(env) as base_url:
            # Warm up the worker (imports, connections) on a separate stack; not timed.
            warm = make_operations(args.batch, seed=99, stack_slug="pull")
            http_push(base_url, secret, "pull", warm, args.batch)

            log(f"pushing {args.memories:,} memories over HTTP in batches of {args.batch}")
            push_seconds, latencies = http_push(base_url, secret, "push", operations, args.batch)
            log("inserting the same rows with psycopg (executemany, one transaction per batch)")
            insert_seconds = psycopg_insert(env.database_url, rows, args.batch)
            log("and with COPY (one transaction)")
            copy_seconds = psycopg_copy(env.database_url, copy_rows)

            pull_ops = make_operations(args.pull - len(warm), seed=2, stack_slug="pull")
            http_push(base_url, secret, "pull", pull_ops, args.batch)
            log(f"pulling {args.pull:,} changes ({args.repeats} times)")
            pulls = time_pulls(base_url, secret, "pull", args.pull, args.repeats)
            select_times = psycopg_select(env.database_url, pull_stack.pk, args.repeats)
            events = None
            if args.events_compare:
                log(f"pushing {args.memories:,} memories each with change events on and off, interleaved")
                events = compare_events(env, secret, args.memories, args.batch)
        load_after = os.getloadavg()

        stored = Stack.objects.get(pk=push_stack.pk)
        assert stored.memory_count == args.memories, stored.memory_count

        n = args.memories
        lat = percentiles(latencies)
        print_table(f"push {n:,} memories, batches of {args.batch}", [
            {"path": "POST /sync/push (HTTP, full service)", "seconds": push_seconds, "ops/s": n / push_seconds,
             "batch p50 ms": lat["p50"], "batch p95 ms": lat["p95"], "x baseline": push_seconds / insert_seconds},
            {"path": "baseline: psycopg executemany INSERT", "seconds": insert_seconds, "ops/s": n / insert_seconds,
             "batch p50 ms": "", "batch p95 ms": "", "x baseline": 1.0},
            {"path": "floor: psycopg COPY", "seconds": copy_seconds, "ops/s": n / copy_seconds,
             "batch p50 ms": "", "batch p95 ms": "", "x baseline": copy_seconds / insert_seconds},
        ])
        select_median = statistics.median(select_times)
        print_table(f"pull {args.pull:,} changes (median of {args.repeats})", [
            {"path": "POST /sync/pull (kernle, complete change set; to last byte)",
             "seconds": statistics.median(pulls["kernle"]), "max s": max(pulls["kernle"]),
             "response MB": pulls["bytes"] / 1e6, "x baseline": statistics.median(pulls["kernle"]) / select_median},
            {"path": "  + client json parse of that response", "seconds": statistics.median(pulls["parse"]),
             "max s": max(pulls["parse"]), "response MB": "", "x baseline": ""},
            {"path": "GET native pull, pages of 1,000", "seconds": statistics.median(pulls["native"]),
             "max s": max(pulls["native"]), "response MB": "",
             "x baseline": statistics.median(pulls["native"]) / select_median},
            {"path": "baseline: psycopg SELECT + json.dumps", "seconds": select_median, "max s": max(select_times),
             "response MB": "", "x baseline": 1.0},
        ])
        if events is not None:
            on, off = events["seconds"]["on"], events["seconds"]["off"]
            on_lat, off_lat = percentiles(events["latencies"]["on"]), percentiles(events["latencies"]["off"])
            print_table(f"push {n:,} memories with change events on vs off (pushes alternating)", [
                {"path": "POST /sync/push, events on", "seconds": on, "ops/s": n / on, "x off": off / on,
                 "batch p50 ms": on_lat["p50"], "batch p95 ms": on_lat["p95"]},
                {"path": "POST /sync/push, MEMORYHUB_EVENTS=off", "seconds": off, "ops/s": n / off, "x off": 1.0,
                 "batch p50 ms": off_lat["p50"], "batch p95 ms": off_lat["p95"]},
            ])
        print(f"\ngoals: push >= 5,000 ops/s -> {n / push_seconds:,.0f} ops/s; "
              f"pull of {args.pull:,} < 1 s -> {statistics.median(pulls['kernle']):.2f} s")
        # The box is shared: the ratios above hold, absolute figures need the load next to them.
        print(f"load average (1/5/15 min) before: {' '.join(f'{x:.2f}' for x in load_before)}, "
              f"after: {' '.join(f'{x:.2f}' for x in load_after)} ({os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
