"""Publishing committed change events (docs/architecture.md §11), and the relay that catches up.

The outbox rows are written by the writers, in their transactions (memories.writes.outbox). After
the commit:

0. the `PUBLISH` effect of the after-commit registry (memories.writes.effects, registered below)
   hands the ids of the transaction's events to this process's publisher thread
   (`publish_committed`, memories.changes.publisher) and returns: the write's response never waits
   for what follows;
1. the events are claimed (`published_at` set, row locked, SKIP LOCKED);
2. each is sent to the channel-layer groups `stack.<stack id>` and `school.<organization id>` as
   {"type": "stack.change", "event": event_dict(...)};
3. each registered event consumer (`effects.register_event_consumer`, e.g. the webhooks fan-out)
   is called with the `ChangeEvent`, in a savepoint of the claiming transaction, unless its
   condition on the event's stack (asked in the claiming statement itself) says it has nothing to do;
4. the claim commits. Anything that fails (Redis down, a consumer raising) is logged and the event
   is left unpublished; `events_relay` (Celery beat, every few seconds) publishes it later, in id
   order. Publishing never raises into a write nor makes it wait; a dead Redis costs the publisher
   thread PUBLISH_TIMEOUT_SECONDS at most, once: for BREAKER_SECONDS after a failure this process
   leaves its events to the relay.

Consumers must be idempotent (the relay may deliver an event a second time after a crash) and
quick: they run on the publisher thread, one event after another, in the claim's transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Coroutine, Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

from channels.layers import get_channel_layer
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction

from memories.changes.feed import event_dict
from memories.changes.publisher import Publisher
from memories.changes.watchers import school_group, stack_group, watched
from memories.models import ChangeEvent
from memories.writes.columns import array_literal
from memories.writes.effects import PUBLISH, Committed, RegisteredConsumer, event_consumers, register_effect
from memories.writes.outbox import REMOVAL_ACTIONS
from stacks.models import Stack

logger = logging.getLogger(__name__)

PUBLISH_TIMEOUT_SECONDS = 1.0  # the publisher thread waits at most this for Redis
RELAY_TIMEOUT_SECONDS = 2.0
BREAKER_SECONDS = 5.0
RELAY_BATCH = 200
RELAY_MAX_BATCHES = 50
RETENTION = timedelta(days=7)
PRUNE_BATCH = 10_000
# pg advisory lock (namespace, key) held by the relay per batch: one relay at a time keeps a
# stack's events in order on the channel layer.
_RELAY_LOCK = (0x4D48, 15)  # "MH", and a key of our own (fixed: every relay must use the same)
_EVENT_TABLE = ChangeEvent._meta.db_table

_CLAIM_SQL = f"""
WITH claimed AS MATERIALIZED (
    SELECT c.id FROM {_EVENT_TABLE} c WHERE c.published_at IS NULL AND {{where}}
    ORDER BY c.id LIMIT %(limit)s FOR UPDATE OF c SKIP LOCKED)
UPDATE {_EVENT_TABLE} e SET published_at = statement_timestamp()
FROM claimed k, {Stack._meta.db_table} s
WHERE e.id = k.id AND s.id = e.stack_id
RETURNING e.id, e.stack_id, e.seq, e.topic, e.action, e.source, e.memory_ids, e.created_at, e.published_at,
          s.slug, s.organization_id{{wanted}}
"""  # noqa: S608 - only table names and the consumers' constant conditions are interpolated
# The writer's own events, unless an older event of the same stack is stuck waiting for the relay
# (Redis was down): the relay then publishes them all, in order. An older event only moments old
# is another process's, being published right now (the embedding worker's, say): no reason to wait.
STUCK_SECONDS = 2
_OWN_EVENTS = f"""c.id = ANY(%(ids)s::bigint[]) AND NOT EXISTS (
    SELECT 1 FROM {_EVENT_TABLE} o WHERE o.published_at IS NULL AND o.id < c.id AND o.stack_id = c.stack_id
      AND o.created_at < statement_timestamp() - interval '{STUCK_SECONDS} seconds')"""  # noqa: S608
_ANY_UNPUBLISHED = "TRUE"
_UNCLAIM_SQL = f"UPDATE {_EVENT_TABLE} SET published_at = NULL WHERE id = ANY(%s)"  # noqa: S608
_EVENT_FIELDS = ("id", "stack_id", "seq", "topic", "action", "source", "memory_ids", "created_at", "published_at")


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


@lru_cache(maxsize=16)
def _claim_sql(where: str, conditions: tuple[str, ...]) -> str:
    """The claiming statement for the events `where` selects, answering each consumer's condition
    (in its order) after the event's columns, its stack's slug and its school. A condition's own `%`
    is doubled: the statement goes through the driver's parameter binding."""
    wanted = "".join(f", ({condition.replace('%', '%%')})" for condition in conditions)
    return _CLAIM_SQL.format(where=where, wanted=wanted)


def _event_of(row: Sequence[Any]) -> ChangeEvent:
    event = ChangeEvent.from_db(DEFAULT_DB_ALIAS, list(_EVENT_FIELDS), list(row[:len(_EVENT_FIELDS)]))
    # For consumers: the stack's slug and school without a query (not columns of the event).
    setattr(event, "stack_slug", row[len(_EVENT_FIELDS)])  # noqa: B010 - not a field: mypy must not see it as one
    setattr(event, "organization_id", row[len(_EVENT_FIELDS) + 1])  # noqa: B010
    return event


def _groups_of(row: Sequence[Any]) -> tuple[str, str]:
    """A claimed event's channel-layer groups: its stack's and its school's."""
    return stack_group(row[_EVENT_FIELDS.index("stack_id")]), school_group(row[len(_EVENT_FIELDS) + 1])


def _deliver(rows: list[Sequence[Any]], consumers: Sequence[RegisteredConsumer], *, timeout: float,
             isolate: bool) -> list[int]:
    """Send claimed events in id order; returns the ids that must stay unpublished. A channel-layer
    failure stops the batch (Redis is everyone's); a consumer failure holds back that stack only.
    `isolate` (the relay): each consumer call in a savepoint, so one whose database work fails
    holds back its stack only; else (a writer's few events) such a failure ends the claim and
    leaves all of them to the relay, saving two round trips per event."""
    layer = get_channel_layer()
    failed: list[int] = []
    held: set[int] = set()
    layer_down = False
    # Only groups someone watches are sent to: a send to an empty group still costs Redis round trips.
    watching = watched(sorted({group for row in rows for group in _groups_of(row)})) if layer is not None else set()
    for row in sorted(rows, key=lambda r: r[0]):
        event = _event_of(row)
        slug = row[len(_EVENT_FIELDS)]
        if layer_down or event.stack_id in held:
            failed.append(event.pk)
            continue
        groups = [group for group in _groups_of(row) if group in watching]
        if groups:
            message = {"type": "stack.change", "event": event_dict(event, slug)}
            try:
                _layer_loop.run(_group_send(layer, groups, message), timeout)
            except Exception as exc:  # Redis down or slow: the relay publishes it later
                _layer_loop.down_until = time.monotonic() + BREAKER_SECONDS
                logger.warning("change event %s not published (%s); left to the relay", event.pk,
                               type(exc).__name__)
                layer_down = True
                failed.append(event.pk)
                continue
        for consumer, wanted in zip(consumers, row[len(_EVENT_FIELDS) + 2:], strict=True):
            if not wanted:
                continue
            try:
                with transaction.atomic() if isolate else contextlib.nullcontext():
                    consumer.consume(event)
            except Exception as exc:
                if isinstance(exc, DatabaseError) and not isolate:
                    raise  # the claim's transaction is unusable: roll it all back
                logger.exception("change event consumer %r failed on event %s; left to the relay", consumer.consume,
                                 event.pk)
                held.add(event.stack_id)
                failed.append(event.pk)
                break
    return failed


def _publish(claim_where: str, params: dict[str, Any], *, timeout: float, relay: bool = False) -> tuple[int, int]:
    """Claim (the events `claim_where` selects), deliver and mark one batch in one transaction;
    (published, left) counts."""
    consumers = event_consumers()
    claim_sql = _claim_sql(claim_where, tuple(consumer.wanted_if for consumer in consumers))
    with transaction.atomic(), connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        if relay:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", list(_RELAY_LOCK))
            if not cursor.fetchone()[0]:
                return 0, 0  # another relay is at work
        cursor.execute(claim_sql, params)
        rows = cursor.fetchall()
        if not rows:
            return 0, 0
        failed = _deliver(rows, consumers, timeout=timeout, isolate=relay)
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
        _publisher.submit(list(event_ids))


def _publish_own(event_ids: list[int]) -> None:
    if _layer_loop.down_until > time.monotonic() and get_channel_layer() is not None:
        return  # Redis failed moments ago: the relay publishes these once it is back
    try:
        ids = array_literal([str(int(event_id)) for event_id in event_ids])  # cast to bigint[] in SQL
        _publish(_OWN_EVENTS, {"ids": ids, "limit": len(event_ids)}, timeout=PUBLISH_TIMEOUT_SECONDS)
    except Exception as exc:  # the database itself: the write has committed, the relay catches up
        logger.warning("change events %s not published (%s); left to the relay", event_ids, type(exc).__name__)


_publisher = Publisher(_publish_own)


def wait_published(timeout: float = 5.0) -> bool:
    """Wait until this process's publisher thread has handled every event handed to it (tests and
    benchmarks; a write never waits). False if it did not within `timeout`."""
    return _publisher.wait_idle(timeout)


def _publish_effect(unit: Committed) -> None:
    publish_committed(unit.event_ids)  # looked up per call: a test may replace it


register_effect(_publish_effect, stage=PUBLISH)


def events_relay(*, batch_size: int = RELAY_BATCH, max_batches: int = RELAY_MAX_BATCHES) -> dict[str, int]:
    """Publish events that are still unpublished (Redis or a consumer failed, a process died after
    its commit), oldest first, in batches; stops at the first batch that leaves some behind (they
    are tried again next run). SKIP LOCKED and an advisory lock per batch: concurrent relays (and
    writers publishing their own events) never publish the same event twice."""
    published = left = 0
    for _ in range(max_batches):
        done, kept = _publish(_ANY_UNPUBLISHED, {"limit": batch_size}, timeout=RELAY_TIMEOUT_SECONDS, relay=True)
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
    events stay until the relay has published them. Removal events (a purge's, an erasure's) stay
    as long as the stack: they are the native pull's only tombstones of memories removed outright
    (memories.sync.pull), ids only, like the erasure's own tombstones."""
    cutoff = (now or datetime.now(UTC)) - older_than
    deleted = 0
    while True:
        with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {_EVENT_TABLE} WHERE id IN (SELECT id FROM {_EVENT_TABLE} "  # noqa: S608
                "WHERE created_at < %s AND published_at IS NOT NULL AND action <> ALL(%s) LIMIT %s)",
                [cutoff, list(REMOVAL_ACTIONS), PRUNE_BATCH])
            batch = cursor.rowcount
        deleted += batch
        if batch < PRUNE_BATCH:
            return deleted
