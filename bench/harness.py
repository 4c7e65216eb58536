"""Shared machinery for the benchmarks in bench/.

Every benchmark prints its own figures next to a baseline measured in the same run (the machine
is noisy; ratios hold). This module gives them:

* `bench_environment(name)` — real embedded PostgreSQL+pgvector and Redis in a throw-away
  directory (or DATABASE_URL / REDIS_URL when set), migrated, with Django set up in-process;
* `web_server(env)` — the real ASGI app under uvicorn in a subprocess, for over-HTTP figures;
* `create_bench_stacks` / `bulk_load_memories` — synthetic stacks and memories written with
  COPY (a million rows in well under a minute, secondary indexes rebuilt afterwards);
* `percentiles`, `print_table` — the figures.

Run a benchmark as `.venv/bin/python bench/<name>.py [--help]`.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
if str(BASE_DIR) not in sys.path:
    sys.path.insert(0, str(BASE_DIR))

from memoryhub.embedded import EmbeddedPostgres, EmbeddedRedis, ManagedProcess, free_port  # noqa: E402


@dataclass
class BenchEnv:
    database_url: str
    redis_url: str
    workdir: Path

    def subprocess_env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ, DATABASE_URL=self.database_url, REDIS_URL=self.redis_url)
        env.update(extra)
        return env


def log(message: str) -> None:
    print(f"[bench] {message}", flush=True)


@contextmanager
def bench_environment(name: str, *, keep: bool = False, data_dir: Path | None = None) -> Iterator[BenchEnv]:
    """Start (or reuse from the environment) Postgres and Redis, migrate, and set up Django.

    With `data_dir` the embedded servers live there and are kept after the run, so a benchmark
    whose load takes tens of minutes can measure the same data again (see bench/search.py)."""
    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
        keep = True
    workdir = data_dir.resolve() if data_dir is not None else Path(tempfile.mkdtemp(prefix=f"memoryhub-bench-{name}-"))
    started: list[EmbeddedPostgres | EmbeddedRedis] = []
    try:
        database_url = os.environ.get("DATABASE_URL", "")
        redis_url = os.environ.get("REDIS_URL", "")
        if not database_url:
            postgres = EmbeddedPostgres(workdir / "postgres", free_port(), log_path=workdir / "postgres.log")
            postgres.process.argv += [
                "-c",
                # An HNSW build (a 100k-row stack's own graph, bench/search.py) spills to on-disk
                # inserts below its graph's size and takes several times longer (the box has 24 GB).
                "maintenance_work_mem=4GB",
                "-c",
                "max_wal_size=8GB",
                "-c",
                "checkpoint_timeout=30min",
                "-c",
                "work_mem=64MB",
            ]
            postgres.prepare()
            postgres.start()
            started.append(postgres)
            postgres.ensure_database("memoryhub_bench")
            database_url = postgres.url("memoryhub_bench")
        if not redis_url:
            redis_server = EmbeddedRedis(workdir / "redis", free_port(), log_path=workdir / "redis.log")
            redis_server.prepare()
            redis_server.start()
            started.append(redis_server)
            redis_url = redis_server.url()
        os.environ["DATABASE_URL"] = database_url
        os.environ["REDIS_URL"] = redis_url
        os.environ.setdefault("EMBEDDING_PROVIDER", "hash")
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memoryhub.settings")
        log(f"migrating {database_url}")
        subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=BASE_DIR, check=True)
        import django

        django.setup()
        yield BenchEnv(database_url=database_url, redis_url=redis_url, workdir=workdir)
    finally:
        for server in reversed(started):
            server.stop()
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


@contextmanager
def web_server(env: BenchEnv, *, workers: int = 1, extra_env: dict[str, str] | None = None,
               app: str = "memoryhub.asgi:application", factory: bool = False) -> Iterator[str]:
    """The real ASGI app under uvicorn; yields its base URL once /health answers. `app` (with
    `factory` when it names a callable returning the app) serves a variant next to it, e.g. a
    baseline in the same run."""
    import httpx

    port = free_port()
    server = ManagedProcess(
        name="web",
        argv=[
            sys.executable,
            "-m",
            "uvicorn",
            app,
            *(["--factory"] if factory else []),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(workers),
            # Named, not "auto": a missing uvloop/httptools then fails here instead of silently
            # benchmarking the slower pure-Python loop and parser.
            "--loop",
            "uvloop",
            "--http",
            "httptools",
            "--no-access-log",
            "--lifespan",
            "off",
            "--log-level",
            "warning",
        ],
        env=env.subprocess_env(**(extra_env or {})),
        cwd=BASE_DIR,
        log_path=env.workdir / "web.log",
    )
    server.start()
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        while True:
            if not server.running():
                raise RuntimeError("web server died:\n" + (env.workdir / "web.log").read_text()[-4000:])
            try:
                if httpx.get(f"{base_url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("web server did not start in 60 s")
            time.sleep(0.2)
        yield base_url
    finally:
        server.stop()


def create_bench_stacks(count: int, *, org_slug: str = "bench-school", prefix: str = "student") -> list[Any]:
    """An organization with `count` stacks (returned in slug order)."""
    from accounts.models import Organization
    from stacks.models import Stack

    org, _ = Organization.objects.get_or_create(slug=org_slug, defaults={"name": "Bench School", "tier": "unlimited"})
    width = max(4, len(str(count)))
    Stack.objects.bulk_create(
        [Stack(organization=org, slug=f"{prefix}-{i:0{width}d}") for i in range(count)],
        batch_size=5000,
        ignore_conflicts=True,
    )
    return list(Stack.objects.filter(organization=org, slug__startswith=f"{prefix}-").order_by("slug"))


# A small vocabulary with a school flavour, so full-text search and load see realistic text.
_WORDS = [
    "fractions",
    "decimals",
    "algebra",
    "geometry",
    "reading",
    "phonics",
    "essay",
    "grammar",
    "spelling",
    "vocabulary",
    "history",
    "biology",
    "chemistry",
    "physics",
    "experiment",
    "homework",
    "quiz",
    "exam",
    "practice",
    "review",
    "lesson",
    "teacher",
    "student",
    "tutor",
    "morning",
    "afternoon",
    "struggled",
    "improved",
    "confident",
    "anxious",
    "curious",
    "focused",
    "distracted",
    "remembered",
    "forgot",
    "explained",
    "asked",
    "answered",
    "wrote",
    "read",
    "solved",
    "drew",
    "counted",
    "measured",
    "compared",
    "visual",
    "verbal",
    "hands-on",
    "examples",
    "patience",
    "encouragement",
    "breaks",
    "music",
    "football",
    "chess",
    "drawing",
    "library",
    "notebook",
    "calculator",
    "diagram",
    "timeline",
    "paragraph",
    "sentence",
    "chapter",
    "story",
    "poem",
    "equation",
    "graph",
    "ratio",
    "percent",
    "negative",
    "numbers",
    "multiplication",
    "division",
    "subtraction",
    "addition",
]
KINDS = ("episode", "note", "belief", "value", "goal", "drive", "relationship", "playbook")
_KIND_WEIGHTS = (0.30, 0.30, 0.15, 0.04, 0.08, 0.03, 0.06, 0.04)


def synthetic_sentence(rng: random.Random, words: int = 12) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words)).capitalize() + "."


def synthetic_memory(rng: random.Random, kind: str) -> tuple[str, dict[str, Any]]:
    """(searchable text, kind-specific data) shaped like the per-kind schemas."""
    sentence = synthetic_sentence(rng, rng.randint(6, 20))
    data: dict[str, Any]
    if kind == "episode":
        outcome = synthetic_sentence(rng, 6)
        data = {
            "objective": sentence,
            "outcome": outcome,
            "outcome_type": rng.choice(["success", "failure"]),
            "lessons": [synthetic_sentence(rng, 5)],
        }
        text = f"{sentence} {outcome} {data['lessons'][0]}"
    elif kind == "note":
        data, text = {"content": sentence, "note_type": "note"}, sentence
    elif kind == "belief":
        data, text = {"statement": sentence, "belief_type": "fact", "is_active": True}, sentence
    elif kind == "value":
        name = rng.choice(_WORDS)
        data, text = {"name": name, "statement": sentence, "priority": rng.randint(0, 100)}, f"{name} {sentence}"
    elif kind == "goal":
        data, text = {"title": sentence, "status": "active", "priority": "medium", "goal_type": "task"}, sentence
    elif kind == "drive":
        drive = rng.choice(["curiosity", "mastery", "connection", "autonomy"])
        data = {"drive_type": drive, "intensity": round(rng.random(), 2), "focus_areas": [rng.choice(_WORDS)]}
        text = f"{drive} {sentence}"
    elif kind == "relationship":
        name = f"Person {rng.randint(1, 500)}"
        data = {
            "entity_name": name,
            "entity_type": "person",
            "relationship_type": "classmate",
            "sentiment": round(rng.uniform(-1, 1), 2),
            "interaction_count": rng.randint(0, 50),
            "notes": sentence,
        }
        text = f"{name} {sentence}"
    else:
        data = {
            "name": rng.choice(_WORDS),
            "description": sentence,
            "trigger_conditions": ["stuck"],
            "steps": [{"action": synthetic_sentence(rng, 4)}],
            "failure_modes": ["gives up"],
        }
        text = f"{data['name']} {sentence}"
    return text, data


# Secondary indexes dropped during a bulk COPY and rebuilt afterwards (much faster than
# maintaining them row by row). The unique constraint stays: it guards correctness.
_DEFERRABLE_INDEX_PREFIX = "memories_"


def _memory_indexes(cursor: Any) -> list[tuple[str, str]]:
    cursor.execute(
        """SELECT indexname, indexdef FROM pg_indexes
           WHERE tablename = 'memories_memory' AND indexname LIKE %s
             AND indexname NOT IN (SELECT conname FROM pg_constraint)""",
        (_DEFERRABLE_INDEX_PREFIX + "%",),
    )
    return [(name, definition) for name, definition in cursor.fetchall()]


def bulk_load_memories(
    stack_sizes: Sequence[tuple[int, int]],
    *,
    seed: int = 7,
    embed: Callable[[list[str]], Any] | None = None,
    embedding_model: str = "bench-hash",
    days_back: int = 365,
    defer_indexes: bool = True,
    progress_every: int = 100_000,
) -> int:
    """Write synthetic memories straight into the memories table with COPY.

    `stack_sizes` is [(stack_pk, n_memories)]. `embed(texts) -> array (n, 384)`, when given,
    fills `embedding` (and marks it current). Rows are written stack by stack, so each stack's
    rows sit together on disk as they would after a sync. Returns the number of rows written.
    Columns not listed here rely on database defaults; a new NOT NULL column without a database
    default must be added here.
    """
    from django.db import connection

    rng = random.Random(seed)
    now = datetime.now(UTC)
    columns = (
        "id",
        "stack_id",
        "kind",
        "record_id",
        "text",
        "data",
        "extra",
        "tags",
        "confidence",
        "source_type",
        "source_entity",
        "derived_from",
        "source_episodes",
        "emotional_valence",
        "emotional_arousal",
        "emotional_tags",
        "subject_ids",
        "access_grants",
        "consent_grants",
        "strength",
        "times_accessed",
        "last_accessed",
        "is_protected",
        "stability",
        "difficulty",
        "last_reviewed_at",
        "forgotten_reason",
        "version",
        "created_at",
        "server_updated_at",
        "embedding",
        "embedding_model",
        "embedded_version",
        "size_bytes",
    )
    written = 0
    started = time.monotonic()
    with connection.cursor() as cursor:
        dropped = _memory_indexes(cursor) if defer_indexes else []
        for name, _ in dropped:
            cursor.execute(f'DROP INDEX IF EXISTS "{name}"')
        raw = cursor.connection  # the psycopg 3 connection underneath Django's
        for stack_pk, count in stack_sizes:
            batch_start = 0
            while batch_start < count:
                batch = min(20_000, count - batch_start)
                rows = []
                texts = []
                for _ in range(batch):
                    kind = rng.choices(KINDS, _KIND_WEIGHTS)[0]
                    text, data = synthetic_memory(rng, kind)
                    created = now - timedelta(days=rng.random() * days_back)
                    accessed = rng.random() < 0.5
                    rows.append(
                        [
                            uuid.uuid4(),
                            stack_pk,
                            kind,
                            str(uuid.uuid4()),
                            text,
                            json.dumps(data),
                            "{}",
                            [rng.choice(_WORDS)],
                            round(rng.uniform(0.3, 1.0), 3),
                            "direct_experience",
                            "",
                            [],
                            [],
                            0.0,
                            0.0,
                            [],
                            [],
                            [],
                            [],
                            1.0,
                            rng.randint(0, 20) if accessed else 0,
                            created + timedelta(days=rng.random()) if accessed else None,
                            kind in ("value", "drive"),
                            round(rng.uniform(0.5, 30.0), 3),
                            5.0,
                            None,
                            "",
                            1,
                            created,
                            created,
                            None,
                            "",
                            None,
                            len(text.encode()) + len(json.dumps(data)),
                        ]
                    )
                    texts.append(text)
                if embed is not None:
                    vectors = embed(texts)
                    for row, vector in zip(rows, vectors, strict=True):
                        row[30] = "[" + ",".join(f"{x:.6f}" for x in vector) + "]"
                        row[31] = embedding_model
                        row[32] = 1
                with (
                    raw.cursor() as copy_cursor,
                    copy_cursor.copy(f"COPY memories_memory ({', '.join(columns)}) FROM STDIN") as copy,
                ):
                    for row in rows:
                        copy.write_row(row)
                written += batch
                batch_start += batch
                if progress_every and written % progress_every < batch:
                    rate = written / max(time.monotonic() - started, 1e-9)
                    log(f"loaded {written:,} memories ({rate:,.0f} rows/s)")
        if dropped:
            log(f"rebuilding {len(dropped)} secondary indexes")
            for name, definition in dropped:
                t0 = time.monotonic()
                cursor.execute(definition)
                log(f"  {name} in {time.monotonic() - t0:.1f}s")
        cursor.execute("ANALYZE memories_memory")
    sync_stack_counters([pk for pk, _ in stack_sizes])
    return written


def sync_stack_counters(stack_ids: Sequence[int]) -> int:
    """Set the stacks' usage counters (`memory_count`, `bytes_used`) from their live rows, as the
    write path keeps them for every write (search reads `memory_count`: BM25's N). Rows written by
    COPY bypass the write path; also fixes a data dir loaded before the loader did this. Returns
    how many stacks changed."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("UPDATE stacks_stack s SET memory_count = c.n, bytes_used = c.bytes "
                       "FROM (SELECT stack_id, count(*) AS n, coalesce(sum(size_bytes), 0) AS bytes "
                       "      FROM memories_memory WHERE deleted_at IS NULL AND stack_id = ANY(%s) "
                       "      GROUP BY stack_id) c "
                       "WHERE s.id = c.stack_id AND (s.memory_count, s.bytes_used) <> (c.n, c.bytes)",
                       [list(stack_ids)])
        return cursor.rowcount


def percentiles(samples_ms: Sequence[float]) -> dict[str, float]:
    ordered = sorted(samples_ms)
    if not ordered:
        return {"n": 0, "p50": math.nan, "p95": math.nan, "p99": math.nan, "mean": math.nan}

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]

    return {
        "n": len(ordered),
        "p50": pick(0.50),
        "p95": pick(0.95),
        "p99": pick(0.99),
        "mean": sum(ordered) / len(ordered),
    }


def print_table(title: str, rows: Sequence[dict[str, Any]]) -> None:
    """A plain fixed-width table; floats with 2 decimals."""
    print(f"\n== {title}")
    if not rows:
        print("(no rows)")
        return
    headers = list(rows[0].keys())

    def fmt(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:,.2f}"
        if isinstance(value, int):
            return f"{value:,}"
        return str(value)

    cells = [[fmt(row.get(h, "")) for h in headers] for row in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    for c in cells:
        print("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)))
    sys.stdout.flush()
