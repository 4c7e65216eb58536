"""The memories app's Celery tasks, each a thin wrapper (ids in, one service call, counts out); the
lifecycle jobs' tasks are in memories/lifecycle/tasks.py. Registered names never change: queued
messages and the beat schedule (memoryhub/schedule.py) find them by name.

* embedding: `memories.embed_memories` (queued by name after commit by the write kernel's one
  enqueuer, memories.writes.hooks; writers never call it directly) and `memories.embedding_sweep`
  (every minute: what the after-commit tasks missed — nothing is lost if the broker is down, the
  rows keep `embedded_version IS NULL`), over memories.search.embedding_jobs and embedding_backlog;
* `memories.stack_vector_indexes`: per-stack HNSW indexes (memories.search.vector_indexes);
* `memories.erase`: a large stack's erasure, batch by batch (memories.governance.erasure);
* the change feed: `memories.events_relay` (publishes what writers could not) and
  `memories.events_prune` (memories.changes.publish, docs/architecture.md §11).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from memories.changes.publish import events_prune, events_relay
from memories.governance.erasure import erasure_run
from memories.governance.guardian_digest import digests_send
from memories.search.embedding_backlog import embedding_sweep_run
from memories.search.embedding_jobs import memories_embed
from memories.search.vector_indexes import stack_vector_indexes_run
from memories.writes.hooks import embedding_message_taken, queue_stack_embedding
from memoryhub.embedding_hold import embedding_held

logger = logging.getLogger(__name__)


@shared_task(name="memories.embed_memories", acks_late=True, ignore_result=True)
def embed_memories(ids: list[str], stack_id: int | None = None) -> dict[str, int]:
    """Embed these memories if they still await an embedding (idempotent, safe to repeat); a short
    batch is filled up with the same stacks' backlog (embedding_jobs._take_batch). `stack_id`: the
    stack whose small writes this message stands for (memories.writes.hooks); what the batch could
    not take of its backlog goes into the stack's next message."""
    if stack_id is not None:
        embedding_message_taken(stack_id)
    result = memories_embed(ids=ids, fill=True)
    if stack_id is not None and result.left_over:
        queue_stack_embedding(stack_id, result.left_over)
    return {"embedded": result.embedded, "filled": result.filled, "claimed_elsewhere": result.skipped_claimed,
            "stale": result.skipped_stale, "left_over": len(result.left_over)}


@shared_task(name="memories.embedding_sweep", acks_late=True, soft_time_limit=5 * 60, time_limit=6 * 60)
def embedding_sweep_task(max_rows: int = 5000) -> dict[str, Any]:
    """Periodic: embed anything the after-commit tasks missed, recorded as a JobRun like every
    scheduled job (an overlapping run is recorded `skipped` and embeds nothing). Not while embedding
    waits out a flood (memoryhub.embedding_hold): the backlog is embedded after it."""
    if embedding_held():
        return {"status": "held"}
    run = embedding_sweep_run(max_rows=max_rows)
    if run.counts.get("embedded"):
        logger.info("embedding sweep: %s embedded in %s ms", run.counts["embedded"], run.duration_ms)
    return run.summary()


@shared_task(name="memories.stack_vector_indexes", acks_late=True, ignore_result=True)
def stack_vector_indexes_task() -> dict[str, Any]:
    """Periodic: give large stacks their own partial HNSW index, or rebuild an outdated one
    (memories.search.vector_indexes), recorded as a JobRun; an overlapping run is recorded `skipped`."""
    return stack_vector_indexes_run().summary()


@shared_task(name="memories.erase", acks_late=True, ignore_result=True)
def erase_task(certificate_id: str) -> dict[str, Any]:
    """Erase what the certificate describes (a large stack), batch by batch with progress on the
    certificate; safe to repeat (memories.governance.erasure.erasure_run)."""
    cert = erasure_run(certificate_id)
    return {"certificate": str(cert.pk), "status": cert.status, **cert.counts}


@shared_task(name="memories.events_relay", ignore_result=True, soft_time_limit=60, time_limit=90)
def events_relay_task() -> dict[str, int]:
    """Periodic (every few seconds): publish change events their writer could not (Redis down, a
    consumer failing, a process gone after its commit), oldest first (memories.changes.publish)."""
    return events_relay()


@shared_task(name="memories.events_prune", ignore_result=True)
def events_prune_task() -> dict[str, int]:
    """Periodic: delete published change events older than 7 days (memories.changes.publish.RETENTION)."""
    deleted = events_prune()
    if deleted:
        logger.info("change events pruned: %s", deleted)
    return {"deleted": deleted}


@shared_task(name="memories.guardian_digest", ignore_result=True)
def guardian_digest_task() -> dict[str, int]:
    """Weekly: e-mail each opted-in guardian their children's counts (memories.governance.guardian_digest)."""
    return {"sent": digests_send()}
