"""Redaction at ingest: its cost per memory, and kernle push throughput with it on vs off.

    .venv/bin/python bench/redaction.py                  # 20,000 operations per side, 3 rounds
    .venv/bin/python bench/redaction.py --quick          # 5,000 per side, 2 rounds (while developing)

One run against real embedded Postgres+pgvector and Redis and the real ASGI app under uvicorn:

* **cost per memory** (in this process, median of `--micro-repeats` timings of a whole set):
  `memories.privacy.redaction.engine.redact_memory` on a normalised clean kernle note / episode (the pre-check
  lets it through) and on a canary note (an e-mail, a phone number, an AWS key, a `knl_sk_` key and
  a card number: every rule walks it), in µs per memory — next to the schema's own normalisation of
  the same records, the step it follows. Also the tombstone lookup a push makes per batch in a
  stack that has had an erasure (`memories.privacy.tombstones.erased_keys`, `--batch` keys, ms per batch).
* **push throughput**: `POST /sync/push` of bench/sync.py's kernle-shaped operations in batches of
  `--batch`, to three sides in turn, one batch each, so all see the same moment's load on a shared
  box: redaction ON (this server), ON into a stack that has had an erasure (`Stack.has_erasures`:
  the tombstone lookup per batch), and OFF — a second server started with
  `MEMORYHUB_REDACTION=off`, which settings honour only next to `MEMORYHUB_BENCH=1` on development
  secrets (never in production). Every round pushes fresh stacks. The ratio to OFF is the median
  of the rounds' ratios, and of the ratios of batches pushed moments apart (the box is shared: its
  load moves within a round). `--dirty` makes that share of the records carry an e-mail and a
  phone number.

Goal: push with redaction >= 0.9x without.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import bench_environment, log, print_table, web_server
from bench.sync import http_push, make_operations
from bench.synthetic import synthetic_memory

CANARY = ("Call Ada's mum at 555-867-5309 or ada.mum@example.org; AWS key AKIAIOSFODNN7EXAMPLE, "
          "our key knl_sk_abcdefghijklmnop1234, card 4111 1111 1111 1111.")


def _median_us(fn: Any, items: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) / items * 1e6)
    return statistics.median(times)


def micro_costs(repeats: int) -> list[dict[str, Any]]:
    """µs per memory of the schema and of redaction, on clean and canary records."""
    from memories.privacy.redaction.engine import redact_memory
    from memories.privacy.redaction.policy import ALL_CATEGORIES
    from memories.records.normalize import normalize_memory

    rng = random.Random(5)
    clean: list[tuple[str, dict[str, Any]]] = []
    for kind in ("note", "episode"):
        for _ in range(200):
            _, data = synthetic_memory(rng, kind)
            data.update(tags=[kind], confidence=0.8, source_type="direct_experience")
            clean.append((kind, data))
    canary = [("note", {"content": f"{CANARY} ({i})", "tags": ["canary"]}) for i in range(200)]
    rows = []
    for label, records in (("clean kernle note / episode", clean), ("canary note (5 rules fire)", canary)):
        normalized = [normalize_memory(kind, data) for kind, data in records]
        assert all(redact_memory(n, ALL_CATEGORIES) is n for n in normalized) == (records is clean)
        schema = _median_us(lambda r=records: [normalize_memory(k, d) for k, d in r], len(records), repeats)
        redact = _median_us(lambda n=normalized: [redact_memory(x, ALL_CATEGORIES) for x in n], len(records),
                            repeats)
        rows.append({"record": label, "redaction us/memory": redact, "baseline: schema us/memory": schema,
                     "x schema": redact / schema})
    return rows


def tombstone_lookup_ms(stack: Any, batch: int, repeats: int) -> float:
    """ms per batch of `batch` keys new to a stack that has tombstones (one indexed query)."""
    from memories.models import ErasedRecord
    from memories.privacy.tombstones import erased_keys, record_key_hash

    ErasedRecord.objects.bulk_create([ErasedRecord(stack=stack, key_hash=record_key_hash("note", f"gone-{i}"))
                                      for i in range(10_000)])
    times = []
    for r in range(repeats):
        keys = {("note", str(uuid.uuid4())) for _ in range(batch)} | {("note", f"gone-{r}")}
        t0 = time.perf_counter()
        found = erased_keys(stack, keys)
        times.append((time.perf_counter() - t0) * 1000)
        assert found == {("note", f"gone-{r}")}
    return statistics.median(times)


def _dirty(operations: list[dict[str, Any]], share: float, seed: int) -> None:
    rng = random.Random(seed)
    for op in operations:
        if rng.random() < share:
            data = op["data"]
            field = "content" if "content" in data else next(k for k, v in data.items() if isinstance(v, str)
                                                             and k not in ("id", "stack_id", "created_at",
                                                                           "local_updated_at", "source_type"))
            email, phone = f"parent{rng.randrange(10**6)}@example.org", f"555-010-{rng.randrange(10**4):04d}"
            data[field] = f"{data[field]} Reach the family at {email} or {phone}."


def push_rounds(env: Any, secret: str, org: Any, memories: int, batch: int, rounds: int,
                dirty: float) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """(ops/s per side and round, ms per batch per side in push order): the sides take one batch
    each in turn, so the i-th batches of the sides ran moments apart."""
    from stacks.models import Stack

    sides = ("on", "on, stack with erasures", "off")
    rates: dict[str, list[float]] = {side: [] for side in sides}
    batch_ms: dict[str, list[float]] = {side: [] for side in sides}
    off_env = {"MEMORYHUB_REDACTION": "off", "MEMORYHUB_BENCH": "1"}
    with web_server(env) as on_url, web_server(env, extra_env=off_env) as off_url:
        urls = {"on": on_url, "on, stack with erasures": on_url, "off": off_url}
        for side in sides:  # warm-up (imports, connections), not timed
            slug = f"warm-{sides.index(side)}"
            Stack.objects.create(organization=org, slug=slug)
            http_push(urls[side], secret, slug, make_operations(batch, seed=90, stack_slug=slug), batch)
        for round_no in range(rounds):
            slugs = {side: f"r{round_no}-{i}" for i, side in enumerate(sides)}
            ops = {}
            for side in sides:
                Stack.objects.create(organization=org, slug=slugs[side],
                                     has_erasures=side == "on, stack with erasures")
                # The same records for every side (seeded by round), under each side's stack id.
                ops[side] = make_operations(memories, seed=100 + round_no, stack_slug=slugs[side])
                _dirty(ops[side], dirty, seed=200 + round_no)
            seconds = dict.fromkeys(sides, 0.0)
            for start in range(0, memories, batch):
                for side in sides:
                    elapsed, _ = http_push(urls[side], secret, slugs[side], ops[side][start:start + batch], batch)
                    seconds[side] += elapsed
                    batch_ms[side].append(elapsed * 1000)
            for side in sides:
                rates[side].append(memories / seconds[side])
            log("round {}: {}".format(round_no + 1, ", ".join(f"{s} {memories / seconds[s]:,.0f} ops/s"
                                                               for s in sides)))
    # The OFF server really did not redact, and the ON one did (a dirty record in each stack).
    if dirty:
        from memories.models import Memory

        on_text = Memory.objects.filter(stack__organization=org, stack__slug="r0-0", text__contains="@example.org")
        off_text = Memory.objects.filter(stack__organization=org, stack__slug="r0-2", text__contains="@example.org")
        assert not on_text.exists() and off_text.exists()
    return rates, batch_ms


def main() -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--memories", type=int, default=20_000, help="operations per side and round (default 20,000)")
    parser.add_argument("--batch", type=int, default=500, help="operations per push (default 500)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; ops/s is the median (default 3)")
    parser.add_argument("--micro-repeats", type=int, default=25, help="timings per cost figure (default 25)")
    parser.add_argument("--dirty", type=float, default=0.0,
                        help="share of records carrying an e-mail and a phone number (default 0)")
    parser.add_argument("--quick", action="store_true", help="5,000 operations per side, 2 rounds")
    args = parser.parse_args()
    if args.quick:
        args.memories, args.rounds, args.micro_repeats = 5_000, 2, 10

    with bench_environment("redaction") as env:
        from accounts.models import Membership, Organization, User
        from accounts.services import api_key_issue
        from stacks.models import Stack

        org = Organization.objects.create(name="Bench redaction", slug=f"bench-red-{uuid.uuid4().hex[:6]}",
                                          tier="unlimited")
        user = User.objects.create_user(username=f"bench-{uuid.uuid4().hex[:6]}")
        Membership.objects.create(user=user, organization=org, role=Membership.Role.ADMIN)
        _, secret = api_key_issue(organization=org, user=user, stack_id=None, name="bench")

        log("timing redaction per memory")
        micro = micro_costs(args.micro_repeats)
        lookup = tombstone_lookup_ms(Stack.objects.create(organization=org, slug="tombs"), args.batch,
                                     args.micro_repeats)
        load_before = os.getloadavg()
        log(f"pushing {args.memories:,} operations per side, {args.rounds} rounds, batches of {args.batch}")
        rates, batch_ms = push_rounds(env, secret, org, args.memories, args.batch, args.rounds, args.dirty)
        load_after = os.getloadavg()

        print_table(f"redaction cost per memory (median of {args.micro_repeats} timings of 400 / 200 records)", micro)
        print(f"tombstone lookup (stack with erasures, {args.batch} new keys): {lookup:.2f} ms per batch "
              f"= {lookup * 1000 / args.batch:.2f} us per operation; skipped for a stack never erased from")
        # On a shared box the load moves within a round: the ratio is taken per round and per pair of
        # batches pushed moments apart (median of each), not between the sides' separate medians.
        rows = []
        for side, r in rates.items():
            per_round = [on / off for on, off in zip(r, rates["off"], strict=True)]
            paired = [off / on for on, off in zip(batch_ms[side], batch_ms["off"], strict=True)]
            rows.append({"side": side, "ops/s (median round)": statistics.median(r), "min": min(r), "max": max(r),
                         "x off (median of rounds)": statistics.median(per_round),
                         "x off (median of batch pairs)": statistics.median(paired)})
        print_table(f"POST /sync/push, {args.memories:,} operations per side and round, batches of {args.batch} "
                    f"({args.rounds} rounds, sides interleaved batch by batch; dirty share {args.dirty:.0%})", rows)
        print(f"\ngoal: push with redaction >= 0.9x without -> {rows[0]['x off (median of rounds)']:.2f}x "
              f"(batch pairs {rows[0]['x off (median of batch pairs)']:.2f}x)")
        print(f"load average (1/5/15 min) before: {' '.join(f'{x:.2f}' for x in load_before)}, "
              f"after: {' '.join(f'{x:.2f}' for x in load_after)} ({os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
