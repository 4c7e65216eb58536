"""The change-event outbox, written by the writer inside its own transaction (docs/architecture.md §11).

Every write to a stack's memories, checkpoint or boot config leaves one `ChangeEvent` row, INSERTed
by `record_change` in the writing transaction (for memories the kernel's `hooks.after_commit` calls
it, so every kernel writer is covered by one call; the checkpoint and boot-config services, the
embedding job and erasure call it themselves). A rolled-back write therefore has no event and a
committed write always has one. After the commit the transaction's events go, as one unit, to the
`PUBLISH` effect of the after-commit registry (memories.writes.effects), which publishes them
(memories.changes.publish).

One event per writing transaction, stack and topic (a purge's or an erasure's own, apart: its ids
are the native pull's tombstones): a push of 500 operations is ONE event naming
500 memory ids, a decay batch one event per stack. A transaction that writes one stack several
times (smart ingest's create and its embedding, a review that recovers) extends its first event,
while that event's unit is still queued (`effects.Queued.live`; its row may still have gone with a
rolled-back savepoint: then it is recorded anew).

`seq` is the highest `change_seq` the write stamped on the stack's rows (read under the stack lock
every such writer holds; the (stack, change_seq) index makes it one probe), or a fresh value of the
same sequence for a write that stamps none (checkpoint, boot config, purge, erasure, embedding,
reviews), so a stack's events are ordered by seq and a consumer resumes with
`memories.changes.feed.events_after`. Every writer holds its stacks' row locks from before it draws
a seq until it commits (the kernel's writers, the TTL purge, erasure and the embedding job alike),
so a stack's events commit in seq order: a consumer that saw seq N has seen every committed event
of that stack below N.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

from memories.models import CHANGE_SEQUENCE, ChangeEvent, Memory
from memories.writes.columns import array_literal
from memories.writes.effects import Committed, Queued
from memoryhub.environment import env_bool

MEMORY = "memory"
CHECKPOINT = "checkpoint"
BOOT_CONFIG = "boot_config"
# The action of an event whose write did several things (a push that creates, updates and forgets).
BATCH = "batch"
# Kernel actions that stamp `change_seq` on the rows they name (memories.writes); every other
# action (review, reinforce, purge, erase, embedded, …) draws a fresh seq for its event.
STAMPING_ACTIONS = frozenset({"create", "update", "forget", "recover", "protect", "unprotect", "delete"})
# A kernel action named differently for event consumers (the change events' vocabulary).
EVENT_ACTIONS = {"expire": "purge"}
# The actions of writes that remove memories outright (TTL and retention purge, erasure): their
# events are the native pull's tombstones of those memories, so they are kept (memories.sync.pull).
PURGE, ERASE = "purge", "erase"
REMOVAL_ACTIONS = frozenset({PURGE, ERASE})
# In an event that also names another action, "embedded" does not make it a "batch" (smart ingest
# stores the new memory's vector in the same transaction as the create).
_MINOR_ACTIONS = frozenset({"embedded"})

# Switch for benchmarks only (bench/sync.py --events-compare): with MEMORYHUB_EVENTS=off nothing is
# recorded — no live pages, no webhooks. Read per call so a test can flip `outbox.ENABLED`.
ENABLED = env_bool("MEMORYHUB_EVENTS", True)

# The stack's newest change_seq: ORDER BY … LIMIT 1, not max(), so the planner walks the (stack,
# change_seq) index backwards for one entry whatever its statistics say (max() was seen scanning a
# stack's every row through the stack index).
_STAMPED_SEQ = (f"COALESCE((SELECT change_seq FROM {Memory._meta.db_table} "  # noqa: S608 - constants
                f"WHERE stack_id = %(stack)s ORDER BY change_seq DESC LIMIT 1), nextval('{CHANGE_SEQUENCE}'))")
_FRESH_SEQ = f"nextval('{CHANGE_SEQUENCE}')"
_EVENT_TABLE = ChangeEvent._meta.db_table
_INSERT_SQL = (f"INSERT INTO {_EVENT_TABLE} (stack_id, seq, topic, action, source, memory_ids, created_at) "  # noqa: S608
               "VALUES (%(stack)s, {seq}, %(topic)s, %(action)s, %(source)s, %(ids)s::text[], statement_timestamp()) "
               "RETURNING id")
_EXTEND_SQL = (f"UPDATE {_EVENT_TABLE} SET memory_ids = memory_ids || %(ids)s::text[], action = %(action)s"  # noqa: S608
               "{seq} WHERE id = %(id)s")


@dataclass(frozen=True)
class Statement:
    """A statement of the writing transaction that can travel with the event's in one round trip
    (`record_change(along=…)`): the write kernel's INSERT of new rows and its counter UPDATE. Named
    parameters only, none of them named like another's of the same round trip (the event's are
    stack, topic, action, source, ids, id). `read`: called with the statement's rows (RETURNING)."""

    sql: str
    params: dict[str, Any]
    read: Callable[[list[tuple[Any, ...]]], None] | None = None


def _run(cursor: Any, along: Sequence[Statement], last: Statement | None = None) -> None:
    """Execute the `along` statements, then `last`, in one round trip (client-side binding sends
    them as one query string), hand each `along` statement's rows to its `read`, and leave the
    cursor on the result of `last`."""
    statements = [*along, *([last] if last is not None else [])]
    cursor.execute("; ".join(statement.sql for statement in statements),
                   {name: value for statement in statements for name, value in statement.params.items()})
    for statement in along:
        if statement.read is not None:
            statement.read(cursor.fetchall())
        cursor.nextset()


@dataclass
class _Pending:
    event_id: int
    actions: set[str]
    ids: set[str]


@dataclass
class _Transaction:
    """This connection's events in its current transaction, and the one unit that hands them to
    the after-commit registry. Valid while that unit is queued: a rollback (of the transaction, or
    of the savepoint that queued it) drops it, and with it this state."""

    connection: Any
    events: dict[tuple[int, str, str], _Pending] = field(default_factory=dict)
    unit: Queued | None = None

    def live(self) -> bool:
        return self.unit is not None and self.unit.live()

    def committed(self) -> Committed:
        return Committed(event_ids=tuple(p.event_id for p in self.events.values()))


_local = threading.local()


def _transaction_state(conn: Any) -> _Transaction:
    state: _Transaction | None = getattr(_local, "state", None)
    if state is not None and state.connection is conn and state.live():
        return state
    state = _Transaction(connection=conn)
    _local.state = state
    return state


def _event_action(actions: set[str]) -> str:
    if len(actions) == 1:
        return next(iter(actions))
    major = actions - _MINOR_ACTIONS
    return next(iter(major)) if len(major) == 1 else BATCH


def record_change(*, stack_id: int, topic: str, source: str, changes: Iterable[tuple[str, Sequence[Any]]],
                  stamped: bool | None = None, along: Sequence[Statement] = ()) -> None:
    """Record what this write did to one stack, in the caller's (writing) transaction: INSERT its
    event, or extend this transaction's event of the stack and topic (a removal: of the stack, topic
    and action). Publishing follows the
    commit (nothing if it rolls back). `changes`: (action, memory ids) pairs; `stamped`: the write
    stamped change_seq on the stack's rows (default: inferred from the actions). Checkpoint and
    boot-config writers pass no ids. The caller holds the stack lock when it stamped rows.
    `along`: statements of the same write (the kernel's INSERT of new rows, its counter UPDATE)
    executed first, in the same round trip — and on their own when there is no event to record."""
    actions: set[str] = set()
    ids: list[str] = []
    for action, memory_ids in changes:
        actions.add(EVENT_ACTIONS.get(action, action))
        ids.extend(str(i) for i in memory_ids)
    if not ENABLED or not actions:
        if along:
            with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
                _run(cursor, along)
        return
    if stamped is None:
        stamped = bool(actions & STAMPING_ACTIONS)
    conn = connections[DEFAULT_DB_ALIAS]
    state = _transaction_state(conn)
    # A removal (purge, erasure) keeps an event of its own, never merged into a "batch": its ids
    # are the native pull's tombstones, read by its action (memories.sync.pull).
    removal = next(iter(actions)) if len(actions) == 1 and actions <= REMOVAL_ACTIONS else ""
    key = (stack_id, topic, removal)
    pending = state.events.get(key)
    with conn.cursor() as cursor:
        if pending is not None:
            fresh = [i for i in dict.fromkeys(ids) if i not in pending.ids]
            merged = pending.actions | actions
            _run(cursor, along, Statement(
                _EXTEND_SQL.format(seq=", seq = GREATEST(seq, " + _STAMPED_SEQ + ")" if stamped else ""),
                {"ids": array_literal(fresh), "action": _event_action(merged), "id": pending.event_id,
                 "stack": stack_id}))
            along = ()  # it ran, whatever the UPDATE found
            if cursor.rowcount:
                pending.actions = merged
                pending.ids.update(fresh)
                return
            # Its row went with a rolled-back savepoint: record anew.
        unique = list(dict.fromkeys(ids))
        _run(cursor, along, Statement(_INSERT_SQL.format(seq=_STAMPED_SEQ if stamped else _FRESH_SEQ),
                                      {"stack": stack_id, "topic": topic, "action": _event_action(actions),
                                       "source": source, "ids": array_literal(unique)}))
        event_id = int(cursor.fetchone()[0])
    state.events[key] = _Pending(event_id=event_id, actions=actions, ids=set(unique))
    if state.unit is None:
        # One unit per transaction, queued with its first event (in autocommit the INSERT has
        # committed already, and the unit runs at once).
        state.unit = Queued(state.committed)
        state.unit.queue()
