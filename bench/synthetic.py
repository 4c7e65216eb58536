"""Synthetic school data for the benchmarks in bench/ (bench/harness.py sets up the servers):

* `create_bench_stacks` — an organization with N stacks;
* `synthetic_sentence` / `synthetic_memory` — school-flavoured text and per-kind memory data;
* `bulk_load_memories` — synthetic memories written with COPY, secondary indexes dropped during
  the load and rebuilt afterwards, then the stacks' usage counters set (`sync_stack_counters`).

Django must be set up first (bench.harness.bench_environment).
"""

from __future__ import annotations

import json
import random
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
if str(BASE_DIR) not in sys.path:
    sys.path.insert(0, str(BASE_DIR))

from bench.harness import log  # noqa: E402


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
