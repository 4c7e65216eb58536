"""Storing vectors: one set-based, version- and model-guarded UPDATE per batch (docs/algorithms.md §10.2).

The write is guarded by `version`: if the text changed while the batch was embedded, the stale
vector is not recorded as current and the row stays in the backlog. It is also guarded by the
deployment's model (memories.search.embedding_model, §10.3), in the same statement, so a switch
racing a batch cannot slip the old model's vectors in. Vectors travel in pgvector's binary form.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from django.db import connection, transaction
from pgvector import Vector
from pgvector.psycopg.vector import VectorBinaryDumper
from psycopg.types import TypeInfo

from memories.models import Memory
from memories.writes.outbox import MEMORY, record_change
from memories.writes.rows import lock_stack_changes
from memoryhub.cpu_priority import interactive_priority
from stacks.models import Stack

EMBEDDING_SOURCE = "embedding"  # the change events' source for stored vectors


# Per database connection: pgvector's type and a binary dumper bound to its oid (looked up once).
_vector_types: weakref.WeakKeyDictionary[Any, tuple[TypeInfo, type[VectorBinaryDumper]]] = weakref.WeakKeyDictionary()


def _binary_vectors_cursor(cursor: Any) -> psycopg.Cursor[Any]:
    """A psycopg cursor on the same connection (so in the same transaction) that binds parameters
    server-side and sends `pgvector.Vector`s in pgvector's binary form (the floats as they are).

    Django's cursors bind client-side, in text: a batch's vectors were formatted to decimal text in
    Python and quoted (a noticeable share of the model's own time; docs/algorithms.md §10.2.1 has
    the figures) and parsed back by Postgres. The oids come from a plain query in
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


@dataclass(frozen=True)
class StoredVector:
    """A vector that was stored: whose, and the write it is of (the memory's `server_updated_at`,
    the change the client was answered for), from which its time to searchable is counted."""

    memory_id: str
    stack_id: int
    organization_id: int
    written_at: datetime


# The batch's stacks and their schools (the stacks to lock; the schools the time to searchable is
# kept for, memoryhub.time_to_searchable).
_BATCH_STACKS_SQL = f"""
SELECT DISTINCT m.stack_id, s.organization_id
  FROM {Memory._meta.db_table} m JOIN {Stack._meta.db_table} s ON s.id = m.stack_id
 WHERE m.id = ANY(%s::uuid[])
"""  # noqa: S608 - the table names are constants


def store_vectors(rows: Sequence[tuple[str, int]], vectors: Sequence[Sequence[float]], model_id: str) -> int:
    """How many of the batch's vectors `store_vector_batch` stored."""
    return len(store_vector_batch(rows, vectors, model_id))


def store_vector_batch(rows: Sequence[tuple[str, int]], vectors: Sequence[Sequence[float]],
                       model_id: str) -> list[StoredVector]:
    """One set-based UPDATE for the batch, guarded by the version each vector was made from and by
    the deployment's model (a row is only written while `model_id` is it; else it stays as it was).
    Returns the vectors it stored.

    Embeddings never cross the wire, so this deliberately does not stamp `change_seq`: a new
    vector is not a change a client needs to pull. It is a change for live pages and webhooks:
    one "embedded" change event per stack of the batch, in the same transaction
    (memories.writes.outbox; set-based: one INSERT per stack, never per memory).
    """
    if not rows:
        return []
    # The stack locks taken below are ones interactive writes, pushes and pulls of those stacks wait
    # for: held at the worker's low priority, each statement would first wait for a core.
    with interactive_priority(), transaction.atomic(), connection.cursor() as cursor:
        # The batch's stack rows first, in pk order (every writer's lock order): the "embedded"
        # events then draw their seq under the stack lock and commit in seq order with the stack's
        # other writes, so a live page resuming from a seq never skips one (memories.writes.outbox).
        # Committed with the WAL flush, unlike the load's access counts: the "embedded" event's seq
        # is published after commit, and an unflushed commit lost in a crash would hand that seq
        # to a later event, which a live page resuming from it would then skip.
        cursor.execute(_BATCH_STACKS_SQL, [[row[0] for row in rows]])
        schools = dict(cursor.fetchall())
        lock_stack_changes(*schools)
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
                RETURNING m.stack_id, m.id, m.server_updated_at
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
        for stack_id, memory_id, _ in stored:
            by_stack.setdefault(stack_id, []).append(memory_id)
        for stack_id, ids in sorted(by_stack.items()):
            record_change(stack_id=stack_id, topic=MEMORY, source=EMBEDDING_SOURCE, changes=[("embedded", ids)])
    return [StoredVector(memory_id=str(memory_id), stack_id=stack_id, organization_id=schools[stack_id],
                         written_at=written_at) for stack_id, memory_id, written_at in stored]

