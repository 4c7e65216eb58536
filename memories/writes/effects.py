"""The one registry of after-commit effects (docs/architecture.md §5.3, §11).

What a memory write causes once it has committed goes through here (every kernel write, and the
change events of every writer); the kernel's own statements stay in the writing transaction
(`rows.counters_statement`), except the TTL purge's deferred counter move (`rows.stack_usage_adjust`),
which must not be swallowed like an effect's failure:

* **effects** (`register_effect`) are called, in the process that wrote, with each `Committed`
  unit of work, in stage order: the publication of the transaction's change events (`PUBLISH`,
  memories.changes.publish, registered when the app is ready), the embedding enqueuer (`EMBED`)
  and the change listeners (`NOTIFY`, both memories.writes.hooks);
* **event consumers** (`register_event_consumer`, e.g. the webhooks fan-out) are called with each
  change event as it is published: by the `PUBLISH` effect right after the commit, or by the relay
  later when that failed (memories.changes.publish), so a consumer never misses a committed write.
  A consumer may name the events it wants with an SQL condition on the event's stack (`wanted_if`,
  e.g. "the school has an enabled webhook endpoint"): the statement that claims the events answers
  it, so a consumer with nothing to do costs no statement of its own.

Units are queued with `transaction.on_commit` (`queue`), Django's public API, so Django's own rule
applies: a unit queued in a transaction or savepoint that rolls back is dropped, and nothing is
published, embedded or announced for it. A kernel write queues one unit (what it did to one stack);
the change-event outbox (memories.writes.outbox) queues one unit per transaction for all of that
transaction's events, and extends it while it is still queued (`Queued.live`).

Nothing here may turn a committed write into an error: an effect that raises is logged and the
others still run. Effects must be safe to lose — the process may die between the commit and its
callbacks — so each has its net: the embedding sweep, the change-event relay.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from django.db import transaction

from memories.models import ChangeEvent

logger = logging.getLogger(__name__)

# Stages, in the order effects run (each unit goes through every effect of every stage).
PUBLISH = 1  # change events, to live pages and event consumers
EMBED = 2  # the embedding enqueuer
NOTIFY = 3  # the change listeners


@dataclass(frozen=True)
class Write:
    """What one committed kernel write did to one stack's memories."""

    stack_id: int
    source: str  # api | sync | ingest | promotion | decay | …
    changes: tuple[tuple[str, tuple[str, ...]], ...]  # (action, memory ids), ids never empty
    embed_ids: tuple[str, ...] = ()  # memories whose text changed
    embed_message_ids: int = 0  # ids per embedding message


@dataclass(frozen=True)
class Committed:
    """One unit of after-commit work: each effect takes the part it is about."""

    event_ids: tuple[int, ...] = ()
    writes: tuple[Write, ...] = ()


Effect = Callable[[Committed], None]
EventConsumer = Callable[[ChangeEvent], None]


@dataclass(frozen=True)
class RegisteredConsumer:
    """An event consumer and the SQL condition on the claimed event's stack row `s` under which it
    wants an event ("TRUE": every event)."""

    consume: EventConsumer
    wanted_if: str = "TRUE"


_effects: list[tuple[int, Effect]] = []
_consumers: list[RegisteredConsumer] = []


def register_effect(effect: Effect, *, stage: int) -> None:
    """Call `effect(unit)` for every committed unit from now on, after the effects of earlier stages."""
    if all(registered is not effect for _, registered in _effects):
        _effects.append((stage, effect))
        _effects.sort(key=lambda entry: entry[0])  # stable: registration order within a stage


def register_event_consumer(consumer: EventConsumer, *, wanted_if: str = "TRUE") -> None:
    """Call `consumer(event)` for every published event from now on (idempotent consumers only), or
    only for those whose stack row `s` (`stacks_stack`: `s.id`, `s.organization_id`, …) meets the SQL
    condition `wanted_if`, a constant of the consumer's own (never built from input)."""
    if all(registered.consume is not consumer for registered in _consumers):
        _consumers.append(RegisteredConsumer(consumer, wanted_if))


def unregister_event_consumer(consumer: EventConsumer) -> None:
    _consumers[:] = [registered for registered in _consumers if registered.consume is not consumer]


def event_consumers() -> tuple[RegisteredConsumer, ...]:
    return tuple(_consumers)


def run(unit: Committed) -> None:
    """Hand a committed unit to every effect, in stage order. Never raises."""
    for _, effect in list(_effects):
        try:
            effect(unit)
        except Exception:  # the write has committed; an effect must not turn it into an error
            logger.exception("after-commit effect %r failed", effect)


def queue(unit: Committed) -> None:
    """Run `unit`'s effects once the current transaction commits (at once outside a transaction)."""

    def after_commit() -> None:
        run(unit)

    transaction.on_commit(after_commit, robust=True)


class Queued:
    """A unit that stays open while its callback is queued: the outbox adds each event of the
    transaction to it; `build()` makes the unit when the callback runs.

    Whether it is still queued is known without reading Django's queue: only that queue holds the
    callback (this keeps a weak reference), so the callback is freed as soon as Django drops it —
    after it ran, or when its transaction or the savepoint that queued it rolled back."""

    def __init__(self, build: Callable[[], Committed]) -> None:
        self._build = build
        self._callback: weakref.ref[Callable[[], None]] | None = None
        self._ran = False

    def queue(self) -> None:
        def after_commit() -> None:
            self._ran = True
            run(self._build())

        self._callback = weakref.ref(after_commit)
        transaction.on_commit(after_commit, robust=True)

    def live(self) -> bool:
        """Queued and not yet run: its transaction is open and the savepoint that queued it was not
        rolled back."""
        return not self._ran and self._callback is not None and self._callback() is not None
