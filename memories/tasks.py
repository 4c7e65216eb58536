"""Embedding tasks: thin wrappers (ids in, service call, counts out) over memories.embedding_jobs.

For writers (ingest, sync push, smart ingest): after changing memories, call

    from memories.tasks import enqueue_embedding
    enqueue_embedding(ids)          # inside the transaction: sends after commit, in batches

or `embed_memories.delay_on_commit([str(id), …])` directly. Nothing is lost if the broker is
down: the rows keep `embedded_version IS NULL` and `embedding_sweep` (every minute, see
memoryhub/schedule.py) picks them up.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from typing import Any

from celery import shared_task
from django.db import transaction

from memories.search.embedding_jobs import EMBED_BATCH_SIZE, memories_embed

logger = logging.getLogger(__name__)


@shared_task(name="memories.embed_memories", acks_late=True, ignore_result=True)
def embed_memories(ids: list[str]) -> dict[str, int]:
    """Embed these memories if they still await an embedding (idempotent, safe to repeat)."""
    result = memories_embed(ids=ids)
    return {"embedded": result.embedded, "claimed_elsewhere": result.skipped_claimed, "stale": result.skipped_stale}


@shared_task(name="memories.embedding_sweep", acks_late=True, soft_time_limit=5 * 60, time_limit=6 * 60)
def embedding_sweep_task(max_rows: int = 5000) -> dict[str, Any]:
    """Periodic: embed anything the after-commit tasks missed, recorded as a JobRun like every
    scheduled job (an overlapping run is recorded `skipped` and embeds nothing)."""
    from memories.search.embedding_jobs import embedding_sweep_run

    run = embedding_sweep_run(max_rows=max_rows)
    if run.counts.get("embedded"):
        logger.info("embedding sweep: %s embedded in %s ms", run.counts["embedded"], run.duration_ms)
    return run.summary()


@shared_task(name="memories.stack_vector_indexes", acks_late=True, ignore_result=True)
def stack_vector_indexes_task() -> dict[str, Any]:
    """Periodic: give large stacks their own partial HNSW index, or rebuild an outdated one
    (memories.vector_indexes), recorded as a JobRun; an overlapping run is recorded `skipped`."""
    from memories.search.vector_indexes import stack_vector_indexes_run

    return stack_vector_indexes_run().summary()


def enqueue_embedding(ids: Iterable[str | uuid.UUID]) -> None:
    """Queue embedding of `ids` once the current transaction commits (immediately if none).

    A failure to reach the broker is logged, never raised: the write already succeeded and the
    periodic sweep will embed these rows anyway.
    """
    wanted = [str(i) for i in ids]
    if not wanted:
        return

    def send() -> None:
        for start in range(0, len(wanted), EMBED_BATCH_SIZE):
            try:
                embed_memories.delay(wanted[start:start + EMBED_BATCH_SIZE])
            except Exception as exc:  # broker down: the sweep is the safety net
                logger.warning("could not queue embedding (%s); the sweep will pick it up", type(exc).__name__)
                return

    transaction.on_commit(send)
