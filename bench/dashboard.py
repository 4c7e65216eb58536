"""Dashboard server time: the school overview and a student's page at 2,000 students / 1,000,000 memories.

    .venv/bin/python bench/dashboard.py                 # 2,000 students, 1,000,000 memories
    .venv/bin/python bench/dashboard.py --scale 0.05    # 100 students, 50,000 memories (a quick run)

One school (tier "unlimited") with `2000 x scale` students and `1,000,000 x scale` memories in real
embedded Postgres+pgvector and Redis (bench/harness.py). What is loaded, and how:

* memories by COPY (`bench.synthetic.bulk_load_memories`), unevenly spread over the students (a
  log-normal share each: a few heavy users, many light ones), `created_at` spread over 60 days;
  all embedded but a ~0.3 % backlog; 5 % of the students archived; one teacher per 25 students;
* the stacks' counters (`memory_count`, `bytes_used`, `last_sync_at`) set from the loaded rows, and
  the write kernel's rollup (`StackDailyActivity`) and `Stack.last_write_at` filled by the backfill
  of memories/migrations/0015_stack_daily_activity.py — the very statements an upgraded
  deployment runs, so the rollup holds what the kernel's bookkeeping would for these rows;
* 30 days of job runs (decay, TTL purge, embedding sweep; one failed) with per-school counts, and
  school keys of which a few expire within two weeks.

Then, server-side in this process through Django's test Client (the whole middleware stack, the
session, the page decorator, the template — no network), interleaved round-robin so every figure
sees the same noise, each `--requests` times after `--warmup`:

* `GET /dashboard/` as the school admin (first page, default sort) — the overview;
* `GET /dashboard/?sort=-write&status=active&q=1` — sorted, filtered;
* `GET /dashboard/?teacher=<id>&sort=-memories&page=1` with htmx headers — the table alone;
* `GET /dashboard/` as a teacher (their ~25 students);
* `GET /dashboard/students/<slug>/` for the student of median size and for the largest;
* baseline: `GET /health` through the same client.

Goals: overview p95 <= 150 ms, student page p95 <= 100 ms.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import bench_environment, log, percentiles, print_table
from bench.synthetic import _memory_indexes, bulk_load_memories, create_bench_stacks

STUDENTS = 2000
MEMORIES = 1_000_000
DAYS = 60
STUDENTS_PER_TEACHER = 25
BACKLOG_SHARE = 0.003
ARCHIVED_SHARE = 0.05


@dataclass
class BenchSchool:
    org: Any
    admin: Any
    teacher: Any
    median: Any  # the stack of median size
    largest: Any
    sizes: list[int]


def spread(total: int, parts: int, rng: random.Random) -> list[int]:
    """`total` split over `parts` log-normally (sums exactly to `total`; everyone gets at least 1)."""
    weights = [rng.lognormvariate(0, 0.9) for _ in range(parts)]
    scale = (total - parts) / sum(weights)
    sizes = [1 + int(w * scale) for w in weights]
    sizes[max(range(parts), key=sizes.__getitem__)] += total - sum(sizes)
    return sizes


def load_school(n_students: int, n_memories: int, seed: int) -> BenchSchool:
    from django.db import connection

    from accounts.models import Membership, Organization, User
    from stacks.models import Stack, TeacherAssignment

    rng = random.Random(seed)
    stacks = create_bench_stacks(n_students, org_slug="bench-dashboard", prefix="student")
    org = stacks[0].organization
    Organization.objects.filter(pk=org.pk).update(tier="unlimited")
    for stack in stacks:
        stack.display_name = f"Student {stack.slug.rsplit('-', 1)[1]}"
    Stack.objects.bulk_update(stacks, ["display_name"], batch_size=2000)
    archived = rng.sample(stacks, int(n_students * ARCHIVED_SHARE))
    Stack.objects.filter(pk__in=[s.pk for s in archived]).update(status=Stack.Status.ARCHIVED,
                                                                 archived_at=datetime.now(UTC))

    admin = User.objects.create_user(username="bench-admin", email="admin@bench.example", password="x" * 20)
    Membership.objects.create(user=admin, organization=org, role=Membership.Role.ADMIN)
    n_teachers = max(2, n_students // STUDENTS_PER_TEACHER)
    teachers = [User.objects.create_user(username=f"bench-teacher-{i}", email=f"teacher{i}@bench.example",
                                         first_name="Teacher", last_name=str(i)) for i in range(n_teachers)]
    Membership.objects.bulk_create([Membership(user=t, organization=org, role=Membership.Role.TEACHER)
                                    for t in teachers])
    TeacherAssignment.objects.bulk_create([TeacherAssignment(user=teachers[i % n_teachers], stack=stack)
                                           for i, stack in enumerate(stacks)])

    sizes = spread(n_memories, n_students, rng)
    t0 = time.monotonic()
    with connection.cursor() as cursor:
        # Secondary indexes off while loading and while the rows are marked embedded (one set-based
        # UPDATE, HOT with no index on the column), then built once.
        dropped = _memory_indexes(cursor)
        for name, _ in dropped:
            cursor.execute(f'DROP INDEX IF EXISTS "{name}"')
        written = bulk_load_memories([(s.pk, n) for s, n in zip(stacks, sizes, strict=True)], seed=seed,
                                     days_back=DAYS, defer_indexes=False)
        log(f"{written:,} memories loaded in {time.monotonic() - t0:.1f}s; marking all but a backlog embedded")
        cursor.execute("UPDATE memories_memory SET embedded_version = version, embedding_model = 'bench-hash' "
                       "WHERE random() >= %s", [BACKLOG_SHARE])
        log(f"rebuilding {len(dropped)} secondary indexes")
        for name, definition in dropped:
            cursor.execute(definition)
            log(f"  {name}")
        # The usage counters are the loader's (bench.synthetic.sync_stack_counters); the last sync for
        # 90 % of the students (the others never synced).
        cursor.execute("""
            UPDATE stacks_stack s SET last_sync_at = CASE WHEN random() < 0.9 THEN m.latest END
            FROM (SELECT stack_id, max(server_updated_at) AS latest
                  FROM memories_memory WHERE deleted_at IS NULL GROUP BY stack_id) m
            WHERE s.id = m.stack_id""")
        backfill = importlib.import_module("memories.migrations.0015_stack_daily_activity")
        t1 = time.monotonic()
        cursor.execute(backfill.BACKFILL_ACTIVITY_SQL)
        cursor.execute(backfill.BACKFILL_LAST_WRITE_SQL)
        log(f"rollup and last writes backfilled in {time.monotonic() - t1:.1f}s")
        cursor.execute("VACUUM ANALYZE memories_memory")
        cursor.execute("ANALYZE stacks_stack")
        cursor.execute("ANALYZE memories_stackdailyactivity")
    ordered = sorted(zip(sizes, stacks, strict=True), key=lambda pair: pair[0])
    median, largest = (Stack.objects.get(pk=ordered[i][1].pk) for i in (len(ordered) // 2, -1))  # counters set
    return BenchSchool(org=org, admin=admin, teacher=teachers[0], median=median, largest=largest, sizes=sizes)


def add_jobs_and_keys(org: Any, admin: Any, stacks: list[Any], seed: int) -> None:
    from django.db.models import F
    from django.utils import timezone

    from accounts.models import ApiKey
    from accounts.services import api_key_issue
    from memories.models import JobRun

    rng = random.Random(seed)
    now = timezone.now()
    runs = []
    for day in range(30):
        at = now - timedelta(days=day, hours=2)
        share = {str(org.pk): {"forgotten": rng.randint(50, 2000)}, "999999": {"forgotten": 5}}
        runs.append(JobRun(name="decay", status=JobRun.Status.SUCCEEDED, finished_at=at, duration_ms=90_000,
                           counts={"forgotten": 1000}, organization_counts=share))
        runs.append(JobRun(name="ttl_purge", status=JobRun.Status.FAILED if day == 2 else JobRun.Status.SUCCEEDED,
                           finished_at=at, duration_ms=800, organization_counts={str(org.pk): {"purged": day % 5}}))
        runs.extend(JobRun(name="embedding_sweep", status=JobRun.Status.SUCCEEDED, finished_at=at, duration_ms=40)
                    for _ in range(24))
    created = JobRun.objects.bulk_create(runs)
    # started_at is auto_now_add: move each run back to its day.
    JobRun.objects.filter(pk__in=[run.pk for run in created]).update(started_at=F("finished_at"))
    for i in range(40):
        key, _ = api_key_issue(organization=org, user=admin, stack_id=stacks[i % len(stacks)].pk, name=f"agent {i}")
        ApiKey.objects.filter(pk=key.pk).update(expires_at=now + timedelta(days=rng.choice([3, 10, 60, 365])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0,
                        help="fraction of 2,000 students / 1,000,000 memories (e.g. 0.05 for a quick run)")
    parser.add_argument("--requests", type=int, default=60, help="measured requests per figure (>= 50)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="keep the embedded servers' data here (a second run with it skips the load)")
    args = parser.parse_args()
    logging.getLogger("django.request").setLevel(logging.ERROR)  # a 404 student page is reported below
    n_students = max(20, round(STUDENTS * args.scale))
    n_memories = max(n_students, round(MEMORIES * args.scale))

    with bench_environment("dashboard", data_dir=args.data_dir) as _env:
        from django.test import Client

        from accounts.models import User
        from stacks.models import Stack

        org_stacks = Stack.objects.filter(organization__slug="bench-dashboard")
        if org_stacks.exists():
            log("reusing the school loaded in --data-dir")
            stacks = list(org_stacks.order_by("memory_count", "slug"))
            school = BenchSchool(org=stacks[0].organization, admin=User.objects.get(username="bench-admin"),
                                 teacher=User.objects.get(username="bench-teacher-0"),
                                 median=stacks[len(stacks) // 2], largest=stacks[-1],
                                 sizes=[s.memory_count for s in stacks])
        else:
            t0 = time.monotonic()
            school = load_school(n_students, n_memories, args.seed)
            add_jobs_and_keys(school.org, school.admin, list(org_stacks.order_by("slug")), args.seed)
            log(f"school ready in {time.monotonic() - t0:.1f}s")

        admin, teacher = Client(), Client()
        admin.force_login(school.admin)
        teacher.force_login(school.teacher)
        teacher_id = school.teacher.pk
        htmx = {"HX-Request": "true", "HX-Target": "stacks-panel"}
        median, largest = school.median, school.largest
        figures: dict[str, tuple[Callable[[], Any], list[float], list[int]]] = {}

        def figure(name: str, request: Callable[[], Any]) -> None:
            figures[name] = (request, [], [])

        figure("overview (admin, first page)", lambda: admin.get("/dashboard/"))
        figure("overview sorted+filtered", lambda: admin.get("/dashboard/", {"sort": "-write", "status": "active",
                                                                              "q": "1"}))
        figure("overview table only (htmx, teacher filter)",
               lambda: admin.get("/dashboard/", {"teacher": teacher_id, "sort": "-memories", "page": "1"},
                                 headers=htmx))
        figure("overview (teacher)", lambda: teacher.get("/dashboard/"))
        figure(f"student page (median: {median.memory_count:,} memories)",
               lambda: admin.get(f"/dashboard/students/{median.slug}/"))
        figure(f"student page (largest: {largest.memory_count:,} memories)",
               lambda: admin.get(f"/dashboard/students/{largest.slug}/"))
        figure("baseline: GET /health", lambda: admin.get("/health"))

        for request, _, _ in figures.values():
            for _ in range(args.warmup):
                request()
        for _ in range(args.requests):
            for request, samples, statuses in figures.values():
                t0 = time.perf_counter()
                response = request()
                samples.append((time.perf_counter() - t0) * 1000)
                statuses.append(response.status_code)

        sizes = school.sizes
        print(f"\nschool: {len(sizes):,} students, {sum(sizes):,} memories (median {sorted(sizes)[len(sizes) // 2]:,}, "
              f"largest {max(sizes):,} per student), {DAYS} days of writes; Django test Client, in-process")
        rows = []
        for name, (_, samples, statuses) in figures.items():
            p = percentiles(samples)
            rows.append({"figure": name, "status": ",".join(sorted({str(s) for s in statuses})), "n": p["n"],
                         "p50 ms": p["p50"], "p95 ms": p["p95"], "p99 ms": p["p99"], "mean ms": p["mean"]})
        print_table("dashboard server time", rows)
        overview_p95 = max(percentiles(figures[name][1])["p95"] for name in list(figures)[:4])
        student = [figures[name] for name in figures if name.startswith("student page")]
        student_p95 = max(percentiles(samples)["p95"] for _, samples, _ in student)
        student_ok = all(set(statuses) == {200} for _, _, statuses in student)
        print(f"\ngoal: overview p95 <= 150 ms -> {'met' if overview_p95 <= 150 else 'NOT met'} "
              f"({overview_p95:.1f} ms, worst of the overview figures)")
        verdict = ("met" if student_p95 <= 100 else "NOT met") if student_ok else "not measurable (page not 200)"
        print(f"goal: student page p95 <= 100 ms -> {verdict} ({student_p95:.1f} ms)")
        if not math.isclose(args.scale, 1.0):
            print(f"(scale {args.scale}: a reduced run; the goals are for --scale 1)")


if __name__ == "__main__":
    main()
