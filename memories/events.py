"""THE change-event path (issue 15; docs/architecture.md §11): a transactional outbox.

Every write to a stack's memories, checkpoint or boot config leaves one `ChangeEvent` row, written
by the writer inside its own transaction (`record_change`; for memories the write kernel's
`memories.writes.hooks.after_commit` calls it, so every kernel writer is covered by one call). A
rolled-back write therefore has no event and a committed write always has one. After the commit:

0. the writer hands the ids of its transaction's events to this process's publisher thread
   (`publish_committed`) and returns: its response never waits for what follows;
1. the events are claimed (`published_at` set, row locked, SKIP LOCKED);
2. each is sent to the channel-layer groups `stack.<stack id>` and `school.<organization id>` as
   {"type": "stack.change", "event": event_dict(...)};
3. each registered consumer (`register_event_consumer`, e.g. the webhooks fan-out) is called with
   the `ChangeEvent`, in a savepoint of the claiming transaction;
4. the claim commits. Anything that fails (Redis down, a consumer raising) is logged and the event
   is left unpublished; `events_relay` (Celery beat, every few seconds) publishes it later, in id
   order. Publishing never raises into a write nor makes it wait; a dead Redis costs the publisher
   thread PUBLISH_TIMEOUT_SECONDS at most, once: for BREAKER_SECONDS after a failure this process
   leaves its events to the relay.

One event per writing transaction, stack and topic: a push of 500 operations is ONE event naming
500 memory ids, a decay batch one event per stack. A transaction that writes one stack several
times (smart ingest's create and its embedding, a review that recovers) extends its first event.

`seq` is the highest `change_seq` the write stamped on the stack's rows (read under the stack lock
every such writer holds; the (stack, change_seq) index makes it one probe), or a fresh value of the
same sequence for a write that stamps none (checkpoint, boot config, purge, erasure, embedding,
reviews), so a stack's events are ordered by seq and a consumer resumes with `events_after`.
Every writer holds its stacks' row locks from before it draws a seq until it commits (the kernel's
writers, the TTL purge, erasure and the embedding job alike), so a stack's events commit in seq
order: a consumer that saw seq N has seen every committed event of that stack below N.

Consumers must be idempotent (the relay may deliver an event a second time after a crash) and
quick: they run on the publisher thread, one event after another, in the claim's transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from channels.layers import get_channel_layer
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction

from memories.models import CHANGE_SEQUENCE, ChangeEvent, Memory
from memoryhub.environment import env_bool
from stacks.models import Stack

logger = logging.getLogger(__name__)

MEMORY = "memory"
CHECKPOINT = "checkpoint"
BOOT_CONFIG = "boot_config"
# The action of an event whose write did several things (a push that creates, updates and forgets).
BATCH = "batch"
# Kernel actions that stamp `change_seq` on the rows they name (memories.writes); every other
# action (review, reinforce, purge, erase, embedded, …) draws a fresh seq for its event.
STAMPING_ACTIONS = frozenset({"create", "update", "forget", "recover", "protect", "unprotect", "delete"})
# A kernel action named differently for event consumers (the issue 15 design's vocabulary).
EVENT_ACTIONS = {"expire": "purge"}
# In an event that also names another action, "embedded" does not make it a "batch" (smart ingest
# stores the new memory's vector in the same transaction as the create).
_MINOR_ACTIONS = frozenset({"embedded"})

PUBLISH_TIMEOUT_SECONDS = 1.0  # the publisher thread waits at most this for Redis
RELAY_TIMEOUT_SECONDS = 2.0
BREAKER_SECONDS = 5.0
RELAY_BATCH = 200
RELAY_MAX_BATCHES = 50
RETENTION = timedelta(days=7)
PRUNE_BATCH = 10_000
# pg advisory lock (namespace, key) held by the relay per batch: one relay at a time keeps a
# stack's events in order on the channel layer.
_RELAY_LOCK = (0x4D48, 15)  # "MH", issue 15

# Switch for benchmarks only (bench/sync.py --events-compare): with MEMORYHUB_EVENTS=off nothing is
# recorded — no live pages, no webhooks. Read per call so a test can flip `events.ENABLED`.
ENABLED = env_bool("MEMORYHUB_EVENTS", True)

EventConsumer = Callable[[ChangeEvent], None]
_consumers: list[EventConsumer] = []


def register_event_consumer(consumer: EventConsumer) -> None:
    """Call `consumer(event)` for every published event from now on (idempotent consumers only)."""
    if consumer not in _consumers:
        _consumers.append(consumer)


def unregister_event_consumer(consumer: EventConsumer) -> None:
    if consumer in _consumers:
        _consumers.remove(consumer)


# --- recording, inside the writing transaction ---------------------------------------------------

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
    (`record_change(along=…)`): the write kernel's counter UPDATE. Named parameters only, none of
    them named like the event statement's (stack, topic, action, source, ids, id)."""

    sql: str
    params: dict[str, Any]


def _run(cursor: Any, sql: str, params: dict[str, Any], along: Statement | None) -> None:
    """Execute `sql`, preceded by `along` in the same round trip (client-side binding sends both as
    one query string), and leave the cursor on the result of `sql`."""
    if along is None:
        cursor.execute(sql, params)
        return
    cursor.execute(f"{along.sql}; {sql}", {**along.params, **params})
    cursor.nextset()


def _array_literal(items: Sequence[str]) -> str:
    """A Postgres text[] literal, every element quoted. Sent as one text parameter: psycopg's list
    adapter inspects each element first (~0.5 ms for a push's 500 ids, on the write's path)."""
    quoted = ('"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"' for item in items)
    return "{" + ",".join(quoted) + "}"


@dataclass
class _Pending:
    event_id: int
    actions: set[str]
    ids: set[str]


@dataclass
class _Transaction:
    """This connection's events in its current transaction, and the one after-commit callback
    that publishes them. Valid while that callback is still queued: a rollback (of the transaction,
    or of the savepoint that queued it) drops the callback, and with it this state."""

    connection: Any
    events: dict[tuple[int, str], _Pending] = field(default_factory=dict)
    queued_at: int | None = None
    done: bool = False

    def live(self) -> bool:
        hooks = self.connection.run_on_commit
        index = self.queued_at
        return (not self.done and index is not None and index < len(hooks)
                and getattr(hooks[index][1], "__self__", None) is self)

    def committed(self) -> None:
        self.done = True
        publish_committed([p.event_id for p in self.events.values()])


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
                  stamped: bool | None = None, along: Statement | None = None) -> None:
    """Record what this write did to one stack, in the caller's (writing) transaction: INSERT its
    event, or extend this transaction's event of the stack and topic. Publishing follows the
    commit (nothing if it rolls back). `changes`: (action, memory ids) pairs; `stamped`: the write
    stamped change_seq on the stack's rows (default: inferred from the actions). Checkpoint and
    boot-config writers pass no ids. The caller holds the stack lock when it stamped rows.
    `along`: a statement of the same write (the kernel's counter UPDATE) executed first, in the same
    round trip — and on its own when there is no event to record."""
    actions: set[str] = set()
    ids: list[str] = []
    for action, memory_ids in changes:
        actions.add(EVENT_ACTIONS.get(action, action))
        ids.extend(str(i) for i in memory_ids)
    if not ENABLED or not actions:
        if along is not None:
            with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
                cursor.execute(along.sql, along.params)
        return
    if stamped is None:
        stamped = bool(actions & STAMPING_ACTIONS)
    conn = connections[DEFAULT_DB_ALIAS]
    state = _transaction_state(conn)
    key = (stack_id, topic)
    pending = state.events.get(key)
    with conn.cursor() as cursor:
        if pending is not None:
            fresh = [i for i in dict.fromkeys(ids) if i not in pending.ids]
            merged = pending.actions | actions
            _run(cursor, _EXTEND_SQL.format(seq=", seq = GREATEST(seq, " + _STAMPED_SEQ + ")" if stamped else ""),
                 {"ids": _array_literal(fresh), "action": _event_action(merged), "id": pending.event_id,
                  "stack": stack_id}, along)
            along = None  # it ran, whatever the UPDATE found
            if cursor.rowcount:
                pending.actions = merged
                pending.ids.update(fresh)
                return
            # Its row went with a rolled-back savepoint: record anew.
        unique = list(dict.fromkeys(ids))
        _run(cursor, _INSERT_SQL.format(seq=_STAMPED_SEQ if stamped else _FRESH_SEQ),
             {"stack": stack_id, "topic": topic, "action": _event_action(actions), "source": source,
              "ids": _array_literal(unique)}, along)
        event_id = int(cursor.fetchone()[0])
    state.events[key] = _Pending(event_id=event_id, actions=actions, ids=set(unique))
    if state.queued_at is None:
        if conn.in_atomic_block:
            state.queued_at = len(conn.run_on_commit)
            transaction.on_commit(state.committed, robust=True)
        else:  # autocommit: the INSERT has committed already
            state.done = True
            publish_committed([event_id])


# --- publishing ------------------------------------------------------------------------------------

_CLAIM_SQL = f"""
WITH claimed AS MATERIALIZED (
    SELECT c.id FROM {_EVENT_TABLE} c WHERE c.published_at IS NULL AND {{where}}
    ORDER BY c.id LIMIT %(limit)s FOR UPDATE OF c SKIP LOCKED)
UPDATE {_EVENT_TABLE} e SET published_at = statement_timestamp()
FROM claimed k, {Stack._meta.db_table} s
WHERE e.id = k.id AND s.id = e.stack_id
RETURNING e.id, e.stack_id, e.seq, e.topic, e.action, e.source, e.memory_ids, e.created_at, e.published_at,
          s.slug, s.organization_id
"""  # noqa: S608 - only table names are interpolated
# The writer's own events, unless an older event of the same stack is stuck waiting for the relay
# (Redis was down): the relay then publishes them all, in order. An older event only moments old
# is another process's, being published right now (the embedding worker's, say): no reason to wait.
STUCK_SECONDS = 2
_CLAIM_OWN = _CLAIM_SQL.format(where=f"""c.id = ANY(%(ids)s) AND NOT EXISTS (
    SELECT 1 FROM {_EVENT_TABLE} o WHERE o.published_at IS NULL AND o.id < c.id AND o.stack_id = c.stack_id
      AND o.created_at < statement_timestamp() - interval '{STUCK_SECONDS} seconds')""")  # noqa: S608
_CLAIM_NEXT = _CLAIM_SQL.format(where="TRUE")
_UNCLAIM_SQL = f"UPDATE {_EVENT_TABLE} SET published_at = NULL WHERE id = ANY(%s)"  # noqa: S608
_EVENT_FIELDS = ("id", "stack_id", "seq", "topic", "action", "source", "memory_ids", "created_at", "published_at")


def event_dict(event: ChangeEvent, stack_slug: str) -> dict[str, Any]:
    """EVENT_DICT: what websocket clients get and a webhook's `data` — ids, never memory text."""
    return {"id": event.pk, "stack": stack_slug, "seq": event.seq, "topic": event.topic, "action": event.action,
            "source": event.source, "memory_ids": [str(i) for i in event.memory_ids],
            "at": event.created_at.astimezone(UTC).isoformat()}


class _LayerLoop:
    """One event loop per process, on its own thread, for the channel layer: its Redis
    connections are kept between publishes (async_to_sync from a plain thread would make a new
    loop, and a new connection, per call), and the publishing thread waits for it with a timeout."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0
        self.down_until = 0.0  # the breaker: skip the layer on the write path until then

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():  # first use, or a forked child
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="change-events", daemon=True).start()
                self._loop, self._pid = loop, os.getpid()
            return self._loop

    def run(self, coroutine: Coroutine[Any, Any, None], timeout: float) -> None:
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(coroutine, timeout), self._running_loop())
        try:
            future.result(timeout + 0.5)
        except FutureTimeout:
            future.cancel()
            raise


_layer_loop = _LayerLoop()


async def _group_send(layer: Any, groups: Sequence[str], message: dict[str, Any]) -> None:
    await asyncio.gather(*(layer.group_send(group, message) for group in groups))


def _event_of(row: Sequence[Any]) -> ChangeEvent:
    event = ChangeEvent.from_db(DEFAULT_DB_ALIAS, list(_EVENT_FIELDS), list(row[:len(_EVENT_FIELDS)]))
    # For consumers: the stack's slug and school without a query (not columns of the event).
    setattr(event, "stack_slug", row[len(_EVENT_FIELDS)])  # noqa: B010 - not a field: mypy must not see it as one
    setattr(event, "organization_id", row[len(_EVENT_FIELDS) + 1])  # noqa: B010
    return event


def _deliver(rows: list[Sequence[Any]], *, timeout: float, isolate: bool) -> list[int]:
    """Send claimed events in id order; returns the ids that must stay unpublished. A channel-layer
    failure stops the batch (Redis is everyone's); a consumer failure holds back that stack only.
    `isolate` (the relay): each consumer call in a savepoint, so one whose database work fails
    holds back its stack only; else (a writer's few events) such a failure ends the claim and
    leaves all of them to the relay, saving two round trips per event."""
    layer = get_channel_layer()
    failed: list[int] = []
    held: set[int] = set()
    layer_down = False
    for row in sorted(rows, key=lambda r: r[0]):
        event = _event_of(row)
        slug, organization_id = row[len(_EVENT_FIELDS)], row[len(_EVENT_FIELDS) + 1]
        if layer_down or event.stack_id in held:
            failed.append(event.pk)
            continue
        if layer is not None:
            message = {"type": "stack.change", "event": event_dict(event, slug)}
            groups = (f"stack.{event.stack_id}", f"school.{organization_id}")
            try:
                _layer_loop.run(_group_send(layer, groups, message), timeout)
            except Exception as exc:  # Redis down or slow: the relay publishes it later
                _layer_loop.down_until = time.monotonic() + BREAKER_SECONDS
                logger.warning("change event %s not published (%s); left to the relay", event.pk,
                               type(exc).__name__)
                layer_down = True
                failed.append(event.pk)
                continue
        for consumer in list(_consumers):
            try:
                with transaction.atomic() if isolate else contextlib.nullcontext():
                    consumer(event)
            except Exception as exc:
                if isinstance(exc, DatabaseError) and not isolate:
                    raise  # the claim's transaction is unusable: roll it all back
                logger.exception("change event consumer %r failed on event %s; left to the relay", consumer,
                                 event.pk)
                held.add(event.stack_id)
                failed.append(event.pk)
                break
    return failed


def _publish(claim_sql: str, params: dict[str, Any], *, timeout: float, relay: bool = False) -> tuple[int, int]:
    """Claim, deliver and mark one batch in one transaction; (published, left) counts."""
    with transaction.atomic(), connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        if relay:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", list(_RELAY_LOCK))
            if not cursor.fetchone()[0]:
                return 0, 0  # another relay is at work
        cursor.execute(claim_sql, params)
        rows = cursor.fetchall()
        if not rows:
            return 0, 0
        failed = _deliver(rows, timeout=timeout, isolate=relay)
        if failed:
            cursor.execute(_UNCLAIM_SQL, [failed])
    return len(rows) - len(failed), len(failed)


def publish_committed(event_ids: Sequence[int]) -> None:
    """After a write committed: have its events published (see the module doc). Never raises.

    Off the writer's thread: the events go to this process's publisher thread, so the write's
    response does not wait for the claim, Redis or the consumers. Inline only when this runs inside
    a transaction still open on this connection (a test capturing on-commit callbacks in its own
    transaction): another connection could not see the rows yet."""
    if not event_ids:
        return
    if connections[DEFAULT_DB_ALIAS].in_atomic_block:
        _publish_own(list(event_ids))
    else:
        _outbox.submit(list(event_ids))


def _publish_own(event_ids: list[int]) -> None:
    if _layer_loop.down_until > time.monotonic() and get_channel_layer() is not None:
        return  # Redis failed moments ago: the relay publishes these once it is back
    try:
        _publish(_CLAIM_OWN, {"ids": event_ids, "limit": len(event_ids)}, timeout=PUBLISH_TIMEOUT_SECONDS)
    except Exception as exc:  # the database itself: the write has committed, the relay catches up
        logger.warning("change events %s not published (%s); left to the relay", event_ids, type(exc).__name__)


class _Outbox:
    """This process's publisher thread: takes committed events' ids from writers, publishes them in
    commit order (several writes' at once when they queue up). A process that exits with ids still
    queued loses nothing: the events are in the table, and the relay publishes them."""

    MAX_QUEUED = 10_000  # beyond this (the database or Redis is stuck) writers leave it to the relay

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[list[int]] = queue.SimpleQueue()
        self._pid = 0
        self._queued = 0
        self._idle = threading.Event()
        self._idle.set()

    def submit(self, event_ids: list[int]) -> None:
        with self._lock:
            if self._pid != os.getpid():  # first use, or a forked child (a Celery worker)
                self._queue, self._queued, self._pid = queue.SimpleQueue(), 0, os.getpid()
                threading.Thread(target=self._work, args=(self._queue,), name="change-events-publisher",
                                 daemon=True).start()
            if self._queued >= self.MAX_QUEUED:
                return
            self._queued += 1
            self._idle.clear()
        self._queue.put(event_ids)

    def _work(self, work: queue.SimpleQueue[list[int]]) -> None:
        while True:
            batches = [work.get()]
            with contextlib.suppress(queue.Empty):
                while len(batches) < 100:
                    batches.append(work.get_nowait())
            try:
                _publish_own([event_id for batch in batches for event_id in batch])
            finally:
                if work.empty():  # idle: give the connection back to the pool (or keep it, CONN_MAX_AGE)
                    with contextlib.suppress(Exception):
                        connections[DEFAULT_DB_ALIAS].close_if_unusable_or_obsolete()
                with self._lock:
                    self._queued -= len(batches)
                    if self._queued <= 0:
                        self._idle.set()

    def wait_idle(self, timeout: float) -> bool:
        return self._idle.wait(timeout)


_outbox = _Outbox()


def wait_published(timeout: float = 5.0) -> bool:
    """Wait until this process's publisher thread has handled every event handed to it (tests and
    benchmarks; a write never waits). False if it did not within `timeout`."""
    return _outbox.wait_idle(timeout)


def events_relay(*, batch_size: int = RELAY_BATCH, max_batches: int = RELAY_MAX_BATCHES) -> dict[str, int]:
    """Publish events that are still unpublished (Redis or a consumer failed, a process died after
    its commit), oldest first, in batches; stops at the first batch that leaves some behind (they
    are tried again next run). SKIP LOCKED and an advisory lock per batch: concurrent relays (and
    writers publishing their own events) never publish the same event twice."""
    published = left = 0
    for _ in range(max_batches):
        done, kept = _publish(_CLAIM_NEXT, {"limit": batch_size}, timeout=RELAY_TIMEOUT_SECONDS, relay=True)
        published += done
        left += kept
        if kept or done + kept < batch_size:
            break
    if published or left:
        logger.info("events relay: %s published, %s left for the next run", published, left)
    if published and not left:
        _layer_loop.down_until = 0.0  # Redis answers again: writers publish their own events
    return {"published": published, "left": left}


def events_prune(*, now: datetime | None = None, older_than: timedelta = RETENTION) -> int:
    """Delete published events older than `older_than` (7 days), in bounded batches. Unpublished
    events stay until the relay has published them."""
    cutoff = (now or datetime.now(UTC)) - older_than
    deleted = 0
    while True:
        with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {_EVENT_TABLE} WHERE id IN (SELECT id FROM {_EVENT_TABLE} "  # noqa: S608
                "WHERE created_at < %s AND published_at IS NOT NULL LIMIT %s)", [cutoff, PRUNE_BATCH])
            batch = cursor.rowcount
        deleted += batch
        if batch < PRUNE_BATCH:
            return deleted


# --- reading ---------------------------------------------------------------------------------------

def events_after(stack: Stack | int, seq: int, limit: int = 500, through: int | None = None) -> list[ChangeEvent]:
    """The stack's events with seq > `seq` (and <= `through`, when given), oldest first, at most
    `limit`: a resume's catch-up, and a live socket's events up to the one just published."""
    stack_id = stack if isinstance(stack, int) else stack.pk
    events = ChangeEvent.objects.filter(stack_id=stack_id, seq__gt=seq)
    if through is not None:
        events = events.filter(seq__lte=through)
    return list(events.order_by("seq")[:max(0, limit)])


def latest_seq(stack: Stack | int) -> int:
    """The stack's newest change sequence number (its events', or its rows' when newer): a page
    reads it before its content and resumes from it with `events_after`."""
    stack_id = stack if isinstance(stack, int) else stack.pk
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute(
            f"SELECT GREATEST((SELECT max(seq) FROM {_EVENT_TABLE} WHERE stack_id = %s), "  # noqa: S608
            f"(SELECT max(change_seq) FROM {Memory._meta.db_table} WHERE stack_id = %s), 0)", [stack_id, stack_id])
        return int(cursor.fetchone()[0])
