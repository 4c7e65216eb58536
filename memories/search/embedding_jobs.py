"""Embedding work: which memories await a vector, claiming them, embedding and storing in bulk.

"Awaiting" means `embedded_version IS NULL` (the write kernel, `memories.writes`, clears it
whenever text changes and queues the row after commit; `embeddings_invalidate_stale_model` and
`embeddings_invalidate_all` clear it for re-embedding, left to the sweep). A partial index
covers exactly those rows, so the backlog count and the sweep stay cheap at any table size.

One model per deployment (memories.search.embedding_model, docs/algorithms.md §10.3): nothing here
stores a vector of another model than the deployment's. A process configured for another model
embeds nothing (`memories_embed` logs why, the sweep's run is recorded as failed with the reason),
and `store_vectors` checks the deployment's model in the same statement that writes, so a switch
racing a batch cannot slip the old model's vectors in. A vector of another model that is already
stored (written before this rule, or by a batch that raced a switch) is re-embedded by the sweep.

Concurrency: a row is claimed with a short-lived Redis lock (`SET NX EX`) before it is embedded,
so two workers (an after-commit task and the periodic sweep, say) never embed the same row at
once — without holding a database row lock during inference, which would stall sync pushes.
The claim is a lease of CLAIM_SECONDS that a heartbeat thread renews every RENEW_SECONDS while
the batch is worked on: a worker killed mid-batch stops renewing, and its rows are free for the
next task or sweep within seconds (a fixed five-minute claim held them that long).
The write is guarded by `version`: if the text changed while we embedded, the stale vector is
not recorded as current and the row stays in the backlog.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
import weakref
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import psycopg
import redis
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from pgvector import Vector
from pgvector.psycopg.vector import VectorBinaryDumper
from psycopg.types import TypeInfo

from memories.events import MEMORY, record_change
from memories.lifecycle.jobs import JOB_EMBEDDING_SWEEP, Progress, run_job
from memories.models import JobRun, Memory
from memories.search.embedding_model import (
    EmbeddingModelMismatch,
    deployment_model_claim,
    deployment_model_mismatch,
    deployment_model_verified,
)
from memories.search.embeddings import Embedder, get_embedder
from memories.writes.rows import lock_stack_changes
from memoryhub.metrics import EMBEDDINGS_STORED

logger = logging.getLogger(__name__)

EMBED_BATCH_SIZE = 64
EMBEDDING_SOURCE = "embedding"  # the change events' source for stored vectors
CLAIM_SECONDS = 15  # the lease; renewed every RENEW_SECONDS while its batch is worked on
RENEW_SECONDS = 5.0
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


# Extend only our own claims.
_RENEW = """
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then redis.call('EXPIRE', key, ARGV[2]) end
end
return 0
"""


@contextlib.contextmanager
def _lease_renewed(ids: Sequence[str], token: str) -> Iterator[None]:
    """Keep renewing our claims on `ids` until the block ends (then release them)."""
    stop = threading.Event()
    keys = [_CLAIM_PREFIX + i for i in ids]

    def renew() -> None:
        while not stop.wait(RENEW_SECONDS):
            try:
                _redis().eval(_RENEW, len(keys), *keys, token, str(CLAIM_SECONDS))
            except redis.RedisError as exc:  # the lease may lapse: the worst case is embedding twice
                logger.warning("embedding claims not renewed (%s)", type(exc).__name__)

    heartbeat = threading.Thread(target=renew, name="embedding-lease", daemon=True)
    heartbeat.start()
    try:
        yield
    finally:
        stop.set()
        heartbeat.join()
        _release(ids, token)


@dataclass
class EmbedResult:
    embedded: int = 0
    skipped_claimed: int = 0  # held by another worker right now
    skipped_stale: int = 0  # changed (or deleted) while we embedded; left in the backlog
    refused: int = 0  # not embedded: this process's model is not the deployment's (logged)
    filled: int = 0  # rows of the same stacks' backlog taken to fill a short batch (`fill=True`)
    left_over: list[str] = field(default_factory=list)  # backlog rows found for the fill but not taken
    ids: list[str] = field(default_factory=list)


# Per database connection: pgvector's type and a binary dumper bound to its oid (looked up once).
_vector_types: weakref.WeakKeyDictionary[Any, tuple[TypeInfo, type[VectorBinaryDumper]]] = weakref.WeakKeyDictionary()


def _binary_vectors_cursor(cursor: Any) -> psycopg.Cursor[Any]:
    """A psycopg cursor on the same connection (so in the same transaction) that binds parameters
    server-side and sends `pgvector.Vector`s in pgvector's binary form (the floats as they are).

    Django's cursors bind client-side, in text: a batch of 64 vectors was formatted to ~200 KB of
    decimal text in Python and quoted (0.1-0.35 ms per vector, 5-15 % of the model's time per text;
    docs/algorithms.md §10.2.1) and parsed back by Postgres. The oids come from a plain query in
    the caller's transaction (psycopg's `TypeInfo.fetch` would open a transaction block of its own)."""
    raw_connection = cursor.cursor.connection  # under Django's wrapper
    known = _vector_types.get(raw_connection)
    if known is None:
        cursor.execute("SELECT 'vector'::regtype::oid, 'vector[]'::regtype::oid")
        oid, array_oid = cursor.fetchone()
        known = (TypeInfo("vector", oid, array_oid), type("VectorDumper", (VectorBinaryDumper,), {"oid": oid}))
        _vector_types[raw_connection] = known
    info, dumper = known
    binary = psycopg.Cursor(raw_connection)
    info.register(binary)
    binary.adapters.register_dumper(Vector, dumper)
    return binary


def store_vectors(rows: Sequence[tuple[str, int]], vectors: Sequence[Sequence[float]], model_id: str) -> int:
    """One set-based UPDATE for the batch, guarded by the version each vector was made from and by
    the deployment's model (a row is only written while `model_id` is it; else it stays as it was).

    Embeddings never cross the wire, so this deliberately does not stamp `change_seq`: a new
    vector is not a change a client needs to pull. It is a change for live pages and webhooks:
    one "embedded" change event per stack of the batch, in the same transaction
    (memories.events; set-based: one INSERT per stack, never per memory).
    """
    if not rows:
        return 0
    with transaction.atomic(), connection.cursor() as cursor:
        # The batch's stack rows first, in pk order (every writer's lock order): the "embedded"
        # events then draw their seq under the stack lock and commit in seq order with the stack's
        # other writes, so a live page resuming from a seq never skips one (memories.events).
        # Committed with the WAL flush, unlike the load's access counts: the "embedded" event's seq
        # is published after commit, and an unflushed commit lost in a crash would hand that seq
        # to a later event, which a live page resuming from it would then skip.
        cursor.execute("SELECT DISTINCT stack_id FROM memories_memory WHERE id = ANY(%s::uuid[])",
                       [[row[0] for row in rows]])
        lock_stack_changes(*(stack_id for (stack_id,) in cursor.fetchall()))
        with _binary_vectors_cursor(cursor) as vectors_cursor, connection.wrap_database_errors:
            vectors_cursor.execute(
                """
                UPDATE memories_memory AS m
                   SET embedding = v.embedding,
                       embedding_model = %s,
                       embedded_version = v.version
                  FROM unnest(%s::uuid[], %s::int[], %b::vector[]) AS v(id, version, embedding)
                 WHERE m.id = v.id AND m.version = v.version AND m.deleted_at IS NULL
                   AND EXISTS (SELECT 1 FROM memories_deploymentembeddingmodel d WHERE d.id = 1 AND d.model_id = %s)
                RETURNING m.stack_id, m.id
                """,
                [
                    model_id,
                    [row[0] for row in rows],
                    [row[1] for row in rows],
                    [Vector(vector) for vector in vectors],
                    model_id,
                ],
            )
            stored = vectors_cursor.fetchall()
        by_stack: dict[int, list[Any]] = {}
        for stack_id, memory_id in stored:
            by_stack.setdefault(stack_id, []).append(memory_id)
        for stack_id, ids in sorted(by_stack.items()):
            record_change(stack_id=stack_id, topic=MEMORY, source=EMBEDDING_SOURCE, changes=[("embedded", ids)])
    return len(stored)


_REFUSAL_LOG_SECONDS = 60.0
_last_refusal_log = [0.0]


def _log_refusal(refusal: EmbeddingModelMismatch) -> None:
    """Say why this process embeds nothing, at most once a minute (each write queues a task)."""
    if time.monotonic() - _last_refusal_log[0] >= _REFUSAL_LOG_SECONDS:
        _last_refusal_log[0] = time.monotonic()
        logger.warning("embedding: %s", refusal)


def _needs_vector(model_id: str) -> Q:
    """Rows awaiting a vector, or holding one of another model than `model_id`."""
    return Q(embedded_version__isnull=True) | ~Q(embedding_model=model_id)


@dataclass
class _Batch:
    """One claimed batch on its way through the pipeline: its rows, its lease, its vectors (a future)."""

    rows: list[tuple[Any, int, str]]
    lease: contextlib.ExitStack
    vectors: Future[list[list[float]]] | None = None


# Which of a batch's own ids still need a vector and, to fill it, other rows awaiting one in the
# same stacks (the backlog's partial index on stack serves the second part). Not the global backlog:
# every stack of a batch is a stack lock its store waits for (store_vectors).
_FILL_SQL = f"""
SELECT m.id, true FROM {Memory._meta.db_table} m
 WHERE m.id = ANY(%(ids)s::uuid[]) AND m.deleted_at IS NULL
   AND (m.embedded_version IS NULL OR m.embedding_model IS DISTINCT FROM %(model)s)
UNION ALL
(SELECT m.id, false FROM {Memory._meta.db_table} m
  WHERE m.stack_id IN (SELECT o.stack_id FROM {Memory._meta.db_table} o WHERE o.id = ANY(%(ids)s::uuid[]))
    AND m.embedded_version IS NULL AND m.deleted_at IS NULL AND NOT (m.id = ANY(%(ids)s::uuid[]))
  LIMIT %(fill)s)
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
    id, 80 % of pushes 1-5): one task per few ids paid the claims, the lease, the read, the store's
    stack lock, statement, event and commit, and the Celery round trip for each few memories,
    several times the model's own cost per memory under load (docs/algorithms.md §10.2.1). Filled,
    a task embeds a full batch, and the tasks of the rows it took find nothing left to do.
    """
    token = uuid.uuid4().hex
    if fill and len(chunk) < EMBED_BATCH_SIZE:
        needed, candidates = _fill_ids(chunk, embedder.model_id)
        claimed = _claim(needed + candidates, token)
        wanted = set(needed)
        own = [i for i in claimed if i in wanted]
        extra = [i for i in claimed if i not in wanted]
        keep = extra[:max(0, EMBED_BATCH_SIZE - len(own))]
        # Claimed to beat other workers to some of them, but more of the stacks' backlog than this
        # batch can take: released, and named in the result for the stack's next message.
        result.left_over = extra[len(keep):]
        _release(result.left_over, token)
        claimed = own + keep
        result.filled += len(keep)
        result.skipped_claimed += len(needed) - len(own)
    else:
        claimed = _claim(chunk, token)
        result.skipped_claimed += len(chunk) - len(claimed)
    if not claimed:
        return None
    lease = contextlib.ExitStack()
    lease.enter_context(_lease_renewed(claimed, token))
    try:
        rows = list(
            Memory.objects.filter(_needs_vector(embedder.model_id), pk__in=claimed, deleted_at__isnull=True)
            .values_list("id", "version", "text")
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
        stored = store_vectors([(str(mid), version) for mid, version, _ in rows], vectors, embedder.model_id)
        result.embedded += stored
        EMBEDDINGS_STORED.inc(stored)
        result.skipped_stale += len(rows) - stored
        result.ids.extend(str(mid) for mid, _, _ in rows)


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
                    _log_refusal(refusal)
                    result.refused = len(wanted) - result.skipped_claimed  # nothing embedded before this
                    return result
                checked = True
            in_flight.append(batch)
            texts = [text for _, _, text in batch.rows]
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


def other_model_ids(model_id: str, *, limit: int) -> list[str]:
    """Ids of (at most `limit`) memories whose current vector is of another model than `model_id`.

    No index serves this (`embedding_model <> x` cannot use one, and an index over a million rows
    for a state that should not exist is not worth its upkeep): it is a sequential scan that stops
    after `limit` hits - cheap while many remain, a full scan (~seconds at 1M rows) when none do.
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
        ids = [i for i in embedding_backlog_ids(limit=EMBED_BATCH_SIZE * 4) if i not in seen]
        if not ids:
            break
        embed(ids)
    if deployment.verified_at is None and budget_left():
        others = [i for i in other_model_ids(deployment.model_id, limit=budget_left()) if i not in seen]
        if not others:
            deployment_model_verified(deployment.model_id)
        for start in range(0, len(others), EMBED_BATCH_SIZE * 4):
            if not budget_left():
                break
            result.other_model += embed(others[start:start + EMBED_BATCH_SIZE * 4])
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
        _log_refusal(refusals[0])
        run.status = JobRun.Status.FAILED
        run.error = str(refusals[0])
        run.save(update_fields=["status", "error"])
    return run

