"""Embedding work: which memories await a vector, claiming them, embedding and storing in bulk.

"Awaiting" means `embedded_version IS NULL` (the write kernel, `memories.writes`, clears it
whenever text changes and queues the row after commit; `embeddings_invalidate_stale_model` and
`embeddings_invalidate_all` clear it for re-embedding, left to the sweep). A partial index
covers exactly those rows, so the backlog count and the sweep stay cheap at any table size.

Concurrency: a row is claimed with a short-lived Redis lock (`SET NX EX`) before it is embedded,
so two workers (an after-commit task and the periodic sweep, say) never embed the same row at
once — without holding a database row lock during inference, which would stall sync pushes.
The write is guarded by `version`: if the text changed while we embedded, the stale vector is
not recorded as current and the row stays in the backlog.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import redis
from django.conf import settings
from django.db import connection

from memories.lifecycle.jobs import JOB_EMBEDDING_SWEEP, Progress, run_job
from memories.models import JobRun, Memory
from memories.search.embeddings import Embedder, get_embedder, vector_literal

logger = logging.getLogger(__name__)

EMBED_BATCH_SIZE = 64
CLAIM_SECONDS = 300  # longer than any batch takes; a crashed worker's claims simply expire
_CLAIM_PREFIX = "mh:embed:claim:"


@cache
def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=5)


def _claim(ids: Sequence[str], token: str) -> list[str]:
    """The subset of `ids` this caller now holds (others are being embedded elsewhere)."""
    if not ids:
        return []
    pipe = _redis().pipeline(transaction=False)
    for memory_id in ids:
        pipe.set(_CLAIM_PREFIX + memory_id, token, nx=True, ex=CLAIM_SECONDS)
    return [memory_id for memory_id, ok in zip(ids, pipe.execute(), strict=True) if ok]


# Release only our own claims (a claim that expired and was re-taken belongs to someone else).
_RELEASE = """
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then redis.call('DEL', key) end
end
return 0
"""


def _release(ids: Sequence[str], token: str) -> None:
    if ids:
        _redis().eval(_RELEASE, len(ids), *[_CLAIM_PREFIX + i for i in ids], token)


@dataclass
class EmbedResult:
    embedded: int = 0
    skipped_claimed: int = 0  # held by another worker right now
    skipped_stale: int = 0  # changed (or deleted) while we embedded; left in the backlog
    ids: list[str] = field(default_factory=list)


def store_vectors(rows: Sequence[tuple[str, int]], vectors: Sequence[Sequence[float]], model_id: str) -> int:
    """One set-based UPDATE for the batch, guarded by the version each vector was made from.

    Embeddings never cross the wire, so this deliberately does not stamp `change_seq`: a new
    vector is not a change a client needs to pull.
    """
    if not rows:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE memories_memory AS m
               SET embedding = v.embedding::vector,
                   embedding_model = %s,
                   embedded_version = v.version
              FROM unnest(%s::uuid[], %s::int[], %s::text[]) AS v(id, version, embedding)
             WHERE m.id = v.id AND m.version = v.version AND m.deleted_at IS NULL
            """,
            [
                model_id,
                [row[0] for row in rows],
                [row[1] for row in rows],
                [vector_literal(vector) for vector in vectors],
            ],
        )
        return cursor.rowcount


def memories_embed(*, ids: Iterable[str | uuid.UUID], embedder: Embedder | None = None) -> EmbedResult:
    """Embed the given memories that still await an embedding, in batches.

    Idempotent: rows already embedded at their current version, deleted rows and rows another
    worker holds are skipped.
    """
    embedder = embedder or get_embedder()
    wanted = list(dict.fromkeys(str(i) for i in ids))
    result = EmbedResult()
    for start in range(0, len(wanted), EMBED_BATCH_SIZE):
        chunk = wanted[start:start + EMBED_BATCH_SIZE]
        token = uuid.uuid4().hex
        claimed = _claim(chunk, token)
        result.skipped_claimed += len(chunk) - len(claimed)
        if not claimed:
            continue
        try:
            rows = list(
                Memory.objects.filter(pk__in=claimed, embedded_version__isnull=True, deleted_at__isnull=True)
                .values_list("id", "version", "text")
            )
            if not rows:
                continue
            vectors = embedder.embed([text for _, _, text in rows])
            stored = store_vectors([(str(mid), version) for mid, version, _ in rows], vectors, embedder.model_id)
            result.embedded += stored
            result.skipped_stale += len(rows) - stored
            result.ids.extend(str(mid) for mid, _, _ in rows)
        finally:
            _release(claimed, token)
    return result


def embedding_backlog_ids(*, limit: int) -> list[str]:
    """Ids of memories awaiting an embedding, oldest change first (served by the partial index)."""
    return [
        str(memory_id)
        for memory_id in Memory.objects.filter(embedded_version__isnull=True, deleted_at__isnull=True)
        .order_by("server_updated_at")
        .values_list("id", flat=True)[:limit]
    ]


def embedding_backlog_count() -> int:
    """How many memories await a current embedding (for /readyz and the re-embed command)."""
    return Memory.objects.filter(embedded_version__isnull=True, deleted_at__isnull=True).count()


@dataclass
class SweepResult:
    embedded: int = 0
    skipped: int = 0
    batches: int = 0


def embedding_sweep(*, max_rows: int = 5000, time_budget_seconds: float = 240.0) -> SweepResult:
    """Embed whatever the after-commit tasks missed (dead worker, Redis blip, model change).

    Bounded by rows and time so a huge backlog is worked off over several runs instead of one task
    running into the hard time limit.
    """
    started = time.monotonic()
    result = SweepResult()
    seen: set[str] = set()
    while result.embedded + result.skipped < max_rows and time.monotonic() - started < time_budget_seconds:
        ids = [i for i in embedding_backlog_ids(limit=EMBED_BATCH_SIZE * 4) if i not in seen]
        if not ids:
            break
        seen.update(ids)
        batch = memories_embed(ids=ids)
        result.batches += 1
        result.embedded += batch.embedded
        result.skipped += batch.skipped_claimed + batch.skipped_stale
    return result


def embeddings_invalidate_stale_model(*, model_id: str | None = None) -> int:
    """Mark every vector made by another model as awaiting re-embedding (one UPDATE).

    The old vector stays in place, but search only compares vectors of the current model, so it
    is never mixed with the new model's space.
    """
    model_id = model_id or get_embedder().model_id
    return (
        Memory.objects.filter(embedded_version__isnull=False, deleted_at__isnull=True)
        .exclude(embedding_model=model_id)
        .update(embedded_version=None)
    )


def embeddings_invalidate_all() -> int:
    """Mark every stored vector as awaiting re-embedding (one UPDATE), e.g. after the model's
    weights changed under the same model id. Like `embeddings_invalidate_stale_model`, the old
    vectors stay until the new ones replace them."""
    return Memory.objects.filter(embedded_version__isnull=False, deleted_at__isnull=True).update(embedded_version=None)


def embedding_sweep_run(*, max_rows: int = 5000, progress: Progress | None = None) -> JobRun:
    """The search side's embedding sweep (`embedding_sweep` above) as a recorded job."""
    def work(counts: dict[str, Any]) -> None:
        result = embedding_sweep(max_rows=max_rows)
        counts.update(embedded=result.embedded, skipped=result.skipped, batches=result.batches)
        if progress is not None:
            progress(result.embedded + result.skipped)

    return run_job(JOB_EMBEDDING_SWEEP, work)

