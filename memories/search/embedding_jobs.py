"""Embedding work: claiming memories that await a vector, embedding and storing them in batches.

`memories_embed` is the pipeline every path uses (the after-commit task, the sweep in
memories.search.embedding_backlog, `manage.py reembed`): claim a batch (memories.search.embedding_claims),
read the rows that still need a vector, run the model, store the vectors
(memories.search.embedding_store), while the next batch is claimed (docs/algorithms.md §10.2).

One model per deployment (memories.search.embedding_model, docs/algorithms.md §10.3): nothing here
stores a vector of another model than the deployment's. A process configured for another model
embeds nothing (`memories_embed` logs why, the sweep's run is recorded as failed with the reason),
and `store_vectors` checks the deployment's model in the same statement that writes, so a switch
racing a batch cannot slip the old model's vectors in. A vector of another model that is already
stored (written before this rule, or by a batch that raced a switch) is re-embedded by the sweep.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from django.db import connection
from django.db.models import Q
from django.utils import timezone

from memories.models import Memory
from memories.search.embedding_claims import claim, lease_renewed, release
from memories.search.embedding_model import EmbeddingModelMismatch, deployment_model_mismatch
from memories.search.embedding_store import StoredVector, store_vector_batch
from memories.search.embeddings import Embedder, get_embedder
from memoryhub import time_to_searchable
from memoryhub.metrics import EMBEDDINGS_STORED, TIME_TO_SEARCHABLE

logger = logging.getLogger(__name__)

EMBED_BATCH_SIZE = 64


@dataclass
class EmbedResult:
    embedded: int = 0
    skipped_claimed: int = 0  # held by another worker right now
    skipped_stale: int = 0  # changed (or deleted) while we embedded; left in the backlog
    refused: int = 0  # not embedded: this process's model is not the deployment's (logged)
    filled: int = 0  # rows of the same stacks' backlog taken to fill a short batch (`fill=True`)
    left_over: list[str] = field(default_factory=list)  # backlog rows found for the fill but not taken
    ids: list[str] = field(default_factory=list)


_REFUSAL_LOG_SECONDS = 60.0
_last_refusal_log = [0.0]


def log_refusal(refusal: EmbeddingModelMismatch) -> None:
    """Say why this process embeds nothing, at most once a minute (each write queues a task)."""
    if time.monotonic() - _last_refusal_log[0] >= _REFUSAL_LOG_SECONDS:
        _last_refusal_log[0] = time.monotonic()
        logger.warning("embedding: %s", refusal)


def _needs_vector(model_id: str) -> Q:
    """Rows awaiting a vector, or holding one of another model than `model_id`."""
    return Q(embedded_version__isnull=True) | ~Q(embedding_model=model_id)


@dataclass
class _Batch:
    """One claimed batch on its way through the pipeline: its rows (id, version, text, the model of
    the vector the row holds now, "" for none), its lease, its vectors (a future)."""

    rows: Sequence[tuple[Any, int, str, str]]
    lease: contextlib.ExitStack
    vectors: Future[list[list[float]]] | None = None


# Which of a batch's own ids still need a vector and, to fill it, other rows awaiting one in the
# same stacks: each stack's oldest first, in turns across the stacks (docs/algorithms.md §10.2.2),
# read in order from the backlog's partial index on (stack, server_updated_at). Not the global
# backlog: every stack of a batch is a stack lock its store waits for (store_vectors).
_FILL_SQL = f"""
SELECT m.id, true FROM {Memory._meta.db_table} m
 WHERE m.id = ANY(%(ids)s::uuid[]) AND m.deleted_at IS NULL
   AND (m.embedded_version IS NULL OR m.embedding_model IS DISTINCT FROM %(model)s)
UNION ALL
(SELECT b.id, false
   FROM (SELECT DISTINCT o.stack_id FROM {Memory._meta.db_table} o WHERE o.id = ANY(%(ids)s::uuid[])) s
  CROSS JOIN LATERAL (
        SELECT m.id, m.server_updated_at, row_number() OVER (ORDER BY m.server_updated_at) AS turn
          FROM {Memory._meta.db_table} m
         WHERE m.stack_id = s.stack_id AND m.embedded_version IS NULL AND m.deleted_at IS NULL
           AND NOT (m.id = ANY(%(ids)s::uuid[]))
         ORDER BY m.server_updated_at LIMIT %(fill)s) b
  ORDER BY b.turn, b.server_updated_at LIMIT %(fill)s)
"""  # noqa: S608 - the table name is a constant


def _fill_ids(chunk: Sequence[str], model_id: str) -> tuple[list[str], list[str]]:
    """(`chunk`'s ids that still need a vector, up to 2 x EMBED_BATCH_SIZE other ids awaiting one in
    their stacks): twice what a batch can take, so a worker racing this one for the same rows
    still leaves enough."""
    with connection.cursor() as cursor:
        cursor.execute(_FILL_SQL, {"ids": list(chunk), "model": model_id, "fill": 2 * EMBED_BATCH_SIZE})
        found = cursor.fetchall()
    return [str(i) for i, own in found if own], [str(i) for i, own in found if not own]


def _take_batch(chunk: list[str], embedder: Embedder, result: EmbedResult, *, fill: bool = False) -> _Batch | None:
    """Claim `chunk`, start renewing the claims, and read the rows that still need a vector (or None).

    `fill`: a short batch is topped up to EMBED_BATCH_SIZE with other rows awaiting a vector in the
    same stacks (`filled` counts them). After-commit tasks are mostly small (a native write is one
    id, most pushes a few): one task per few ids paid the claims, the lease, the read, the store's
    stack lock, statement, event and commit, and the Celery round trip for each few memories,
    several times the model's own cost per memory under load (docs/algorithms.md §10.2.1). Filled,
    a task embeds a full batch, and the tasks of the rows it took find nothing left to do.
    """
    token = uuid.uuid4().hex
    if fill and len(chunk) < EMBED_BATCH_SIZE:
        needed, candidates = _fill_ids(chunk, embedder.model_id)
        claimed = claim(needed + candidates, token)
        wanted = set(needed)
        own = [i for i in claimed if i in wanted]
        extra = [i for i in claimed if i not in wanted]
        keep = extra[:max(0, EMBED_BATCH_SIZE - len(own))]
        # Claimed to beat other workers to some of them, but more of the stacks' backlog than this
        # batch can take: released, and named in the result for the stack's next message.
        result.left_over = extra[len(keep):]
        release(result.left_over, token)
        claimed = own + keep
        result.filled += len(keep)
        result.skipped_claimed += len(needed) - len(own)
    else:
        claimed = claim(chunk, token)
        result.skipped_claimed += len(chunk) - len(claimed)
    if not claimed:
        return None
    lease = contextlib.ExitStack()
    lease.enter_context(lease_renewed(claimed, token))
    try:
        rows = list(
            Memory.objects.filter(_needs_vector(embedder.model_id), pk__in=claimed, deleted_at__isnull=True)
            .values_list("id", "version", "text", "embedding_model")
        )
    except BaseException:
        lease.close()
        raise
    if not rows:
        lease.close()
        return None
    return _Batch(rows=rows, lease=lease)


def _store_batch(batch: _Batch, embedder: Embedder, result: EmbedResult) -> None:
    """Wait for the batch's vectors, store them and release its claims."""
    with batch.lease:
        assert batch.vectors is not None
        vectors = batch.vectors.result()
        rows = batch.rows
        stored = store_vector_batch([(str(mid), version) for mid, version, _, _ in rows], vectors, embedder.model_id)
        other_model = {str(mid) for mid, _, _, model in rows if model and model != embedder.model_id}
        _searchable_now(stored, other_model)
        result.embedded += len(stored)
        EMBEDDINGS_STORED.inc(len(stored))
        result.skipped_stale += len(rows) - len(stored)
        result.ids.extend(str(mid) for mid, _, _, _ in rows)


def _searchable_now(stored: list[StoredVector], replaced_other_model: set[str]) -> None:
    """Each stored vector's time to searchable: from its memory's acknowledged write to now, just
    after the store's commit (memoryhub.time_to_searchable, docs/algorithms.md §10.2.3). A vector
    that replaced another model's (a model switch's re-embedding) is not counted: its memory was
    written long ago and waited for the switch, not for the worker."""
    now = timezone.now()
    samples = [time_to_searchable.Sample(organization_id=vector.organization_id, stack_id=vector.stack_id,
                                         seconds=max(0.0, (now - vector.written_at).total_seconds()))
               for vector in stored if vector.memory_id not in replaced_other_model]
    for sample in samples:
        TIME_TO_SEARCHABLE.observe(sample.seconds)
    time_to_searchable.record(samples, stored_at=now.timestamp())


def memories_embed(*, ids: Iterable[str | uuid.UUID], embedder: Embedder | None = None,
                   fill: bool = False) -> EmbedResult:
    """Embed the given memories that await an embedding (or hold another model's vector), in batches.

    Idempotent: rows already embedded at their current version with this model, deleted rows and
    rows another worker holds are skipped. A process configured for another model than the
    deployment's embeds nothing (`refused`, logged).

    Two stages (docs/algorithms.md §10.2): the model runs on one helper thread while this thread
    stores the previous batch and claims and reads the next one. The model (ONNX Runtime) and the
    database wait both release the GIL, so storing a batch, which costs Postgres about half the
    model's time (mostly the HNSW insert), hides behind the next batch's inference instead of
    adding to it. At most two batches are in flight; each keeps its lease until it is stored.

    `fill` (the after-commit task): the last batch, when short, is topped up with other rows
    awaiting a vector in the same stacks (see `_take_batch`).
    """
    embedder = embedder or get_embedder()
    wanted = list(dict.fromkeys(str(i) for i in ids))
    result = EmbedResult()
    batch_size = EMBED_BATCH_SIZE
    chunks = [wanted[start:start + batch_size] for start in range(0, len(wanted), batch_size)]
    checked = False  # the deployment's model is read (or claimed) once there is something to embed
    in_flight: list[_Batch] = []
    # One batch needs no second thread; several get one for the model (see the docstring).
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedding-model") if len(chunks) > 1 else None
    try:
        for number, chunk in enumerate(chunks, start=1):
            batch = _take_batch(chunk, embedder, result, fill=fill and number == len(chunks))
            if batch is None:
                continue
            if not checked:
                refusal = deployment_model_mismatch(embedder.model_id)
                if refusal is not None:
                    batch.lease.close()
                    log_refusal(refusal)
                    result.refused = len(wanted) - result.skipped_claimed  # nothing embedded before this
                    return result
                checked = True
            in_flight.append(batch)
            texts = [text for _, _, text, _ in batch.rows]
            if pool is None:
                batch.vectors = Future()
                batch.vectors.set_result(embedder.embed(texts))
            else:
                batch.vectors = pool.submit(embedder.embed, texts)
            if len(in_flight) > 1:  # store the previous batch while the model works on this one
                _store_batch(in_flight.pop(0), embedder, result)
        while in_flight:
            _store_batch(in_flight.pop(0), embedder, result)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)  # an error: nothing keeps running past this call
        for batch in in_flight:  # an error left these unstored: free their claims for the next worker
            batch.lease.close()
    return result

