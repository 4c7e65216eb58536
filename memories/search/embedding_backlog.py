"""The embedding backlog: what awaits a vector, the periodic sweep over it, and re-embedding.

"Awaiting" means `embedded_version IS NULL` (the write kernel, `memories.writes`, clears it
whenever text changes and queues the row after commit; `embeddings_invalidate_stale_model` and
`embeddings_invalidate_all` clear it for re-embedding, left to the sweep). A partial index
covers exactly those rows, so the backlog count and the sweep stay cheap at any table size.
The sweep embeds through memories.search.embedding_jobs.memories_embed; memories.tasks runs it
as the `memories.embedding_sweep` Celery task (docs/algorithms.md §10.2, §10.3).
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from django.db import connection

from memories.lifecycle.jobs import JOB_EMBEDDING_SWEEP, Progress, run_job
from memories.models import JobRun, Memory
from memories.search import embedding_jobs
from memories.search.embedding_jobs import log_refusal, memories_embed
from memories.search.embedding_model import (
    EmbeddingModelMismatch,
    deployment_model_claim,
    deployment_model_verified,
)
from memories.search.embeddings import Embedder, get_embedder
from memoryhub.worker_priority import AWAITING_VECTORS, BACKLOG_STACKS_CTE, OLDEST_AWAITING_IN_W

# Round-robin over the stacks with a backlog, each stack's oldest change first: the rows in order of
# (their turn in their stack, change time), as `row_number() OVER (PARTITION BY stack_id ORDER BY
# server_updated_at)` would rank them, without reading and sorting the whole backlog. Every step is
# a probe or a short range of the partial index on (stack, server_updated_at):
# * `waiting`: the stacks with a backlog, one index probe each (a loose index scan);
# * `heads`: each one's oldest awaiting change; only the `limit` stacks with the oldest heads can
#   have a row among the first `limit` (each stack's first turn comes before any second turn);
# * the lateral: each of those stacks' oldest rows, numbered in turn, read in index order; at most
#   `limit` + 1 - (the number of heads) of them, since every other head's first turn comes first.
_ROUND_ROBIN_SQL = f"""
WITH RECURSIVE {BACKLOG_STACKS_CTE}, heads AS (
    SELECT w.stack_id, {OLDEST_AWAITING_IN_W} AS oldest
      FROM waiting w WHERE w.stack_id IS NOT NULL
     ORDER BY oldest LIMIT %(limit)s
)
SELECT t.id FROM heads h CROSS JOIN LATERAL (
    SELECT m.id, m.server_updated_at, row_number() OVER (ORDER BY m.server_updated_at) AS turn
      {AWAITING_VECTORS} AND m.stack_id = h.stack_id AND NOT (m.id = ANY(%(exclude)s::uuid[]))
     ORDER BY m.server_updated_at LIMIT %(limit)s + 1 - (SELECT count(*) FROM heads)) t
 ORDER BY t.turn, t.server_updated_at LIMIT %(limit)s
"""  # noqa: S608 - only fixed text is interpolated


def embedding_backlog_ids(*, limit: int, exclude: Collection[str] = ()) -> list[str]:
    """Ids of (at most `limit`) memories awaiting an embedding, round-robin across stacks, each
    stack's oldest change first (docs/algorithms.md §10.2.2): the first row of every stack with a
    backlog, oldest first, then every stack's second, and so on. One school's import of thousands
    of rows then takes its turns beside another school's few new rows instead of ahead of them.
    `exclude`: ids not to return (rows the caller already tried: held elsewhere, or stale)."""
    with connection.cursor() as cursor:
        cursor.execute(_ROUND_ROBIN_SQL, {"limit": limit, "exclude": list(exclude)})
        return [str(memory_id) for (memory_id,) in cursor.fetchall()]


def embedding_backlog_count() -> int:
    """How many memories await a current embedding (for /readyz and the re-embed command)."""
    return Memory.objects.filter(embedded_version__isnull=True, deleted_at__isnull=True).count()


def other_model_ids(model_id: str, *, limit: int) -> list[str]:
    """Ids of (at most `limit`) memories whose current vector is of another model than `model_id`.

    No index serves this (`embedding_model <> x` cannot use one, and an index over a million rows
    for a state that should not exist is not worth its upkeep): it is a sequential scan that stops
    after `limit` hits - cheap while many remain, a full scan (seconds on a large table) when none do.
    The sweep therefore runs it only while the deployment's model is unverified (see
    `embedding_sweep`), not every minute.
    """
    return [
        str(memory_id)
        for memory_id in Memory.objects.filter(embedded_version__isnull=False, deleted_at__isnull=True)
        .exclude(embedding_model=model_id)
        .values_list("id", flat=True)[:limit]
    ]


@dataclass
class SweepResult:
    embedded: int = 0
    skipped: int = 0
    batches: int = 0
    other_model: int = 0  # of `embedded`: vectors of another model replaced by the deployment's


def embedding_sweep(*, max_rows: int = 5000, time_budget_seconds: float = 240.0,
                    embedder: Embedder | None = None) -> SweepResult:
    """Embed whatever the after-commit tasks missed (dead worker, Redis blip, model change), then
    re-embed stored vectors of another model than the deployment's.

    Bounded by rows and time so a huge backlog is worked off over several runs instead of one task
    running into the hard time limit. Raises EmbeddingModelMismatch (and embeds nothing) when
    this process is configured for another model than the deployment's.

    Vectors of another model can only exist after the deployment's model was recorded or switched
    (every writer checks it since), so they are looked for only while the record is unverified:
    each run then takes one bounded batch of them (`other_model_ids`), and the first run that finds
    none marks the record verified. In the steady state the sweep costs what it did before: the
    backlog's partial index (`memories_embedding_backlog`), nothing else.
    """
    embedder = embedder or get_embedder()
    deployment = deployment_model_claim(embedder.model_id)
    if deployment.model_id != embedder.model_id:
        raise EmbeddingModelMismatch(configured=embedder.model_id, deployment=deployment.model_id)
    started = time.monotonic()
    result = SweepResult()
    seen: set[str] = set()

    def budget_left() -> int:
        if time.monotonic() - started >= time_budget_seconds:
            return 0
        return max(0, max_rows - result.embedded - result.skipped)

    def embed(ids: list[str]) -> int:
        seen.update(ids)
        batch = memories_embed(ids=ids, embedder=embedder)
        result.batches += 1
        result.embedded += batch.embedded
        result.skipped += batch.skipped_claimed + batch.skipped_stale + batch.refused
        return batch.embedded

    while budget_left():
        ids = embedding_backlog_ids(limit=embedding_jobs.EMBED_BATCH_SIZE * 4, exclude=seen)
        if not ids:
            break
        embed(ids)
    if deployment.verified_at is None and budget_left():
        others = [i for i in other_model_ids(deployment.model_id, limit=budget_left()) if i not in seen]
        if not others:
            deployment_model_verified(deployment.model_id)
        for start in range(0, len(others), embedding_jobs.EMBED_BATCH_SIZE * 4):
            if not budget_left():
                break
            result.other_model += embed(others[start:start + embedding_jobs.EMBED_BATCH_SIZE * 4])
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
    """The search side's embedding sweep (`embedding_sweep` above) as a recorded job.

    A process configured for another model than the deployment's records its run as failed, with
    the reason as the run's error (visible at /api/v1/jobs/), and logs it once: no traceback each
    minute, nothing embedded.
    """
    refusals: list[EmbeddingModelMismatch] = []

    def work(counts: dict[str, Any]) -> None:
        try:
            result = embedding_sweep(max_rows=max_rows)
        except EmbeddingModelMismatch as refusal:
            refusals.append(refusal)
            return
        counts.update(embedded=result.embedded, skipped=result.skipped, batches=result.batches,
                      other_model=result.other_model)
        if progress is not None:
            progress(result.embedded + result.skipped)

    run = run_job(JOB_EMBEDDING_SWEEP, work)
    if refusals:
        log_refusal(refusals[0])
        run.status = JobRun.Status.FAILED
        run.error = str(refusals[0])
        run.save(update_fields=["status", "error"])
    return run

