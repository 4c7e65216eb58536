"""The write kernel's extension points and its own after-commit effects. Of memories it imports
only the model, the schema, redaction and the kernel's outbox and effect registry, so every writer
can use it.

* **Transforms** (`register_transform`) run on every payload after the schema has validated it and
  before anything is stored or derived from it (`prepare_memory`, used by the single-row and the
  set-based form alike). Redaction (memories.privacy.redaction) runs first, called by `prepare_memory`
  itself. A transform returns a self-consistent `NormalizedMemory` (`text` the canonical text of
  its `data`, `size_bytes` recomputed, `data_json` / `extra_json` None or matching) and must be
  idempotent: sync normalises a stored, already transformed record again when it merges list
  fields into it.
* **`after_commit`**, called by every kernel writer inside its transaction, once per write: records
  the write's change event (memories.writes.outbox) with its counter UPDATE in one round trip, and
  queues the write's unit in the after-commit registry (memories.writes.effects), where this module
  registers the two effects below.
* **Listeners** (`register_listener`, the `NOTIFY` effect) hear about every committed write: one
  `MemoryChange` (stack, action, memory ids, source) per write and action, after commit, never for
  a rolled-back write. A listener that raises is logged; the write has already committed. (Live
  pages and webhooks use the change events instead: they must not miss a write when this process
  dies.)
* **The embedding enqueuer** (the `EMBED` effect): ids of memories whose text changed go to the
  `memories.embed_memories` task after commit, up to 500 ids per broker message (one message per
  push of 500: each publish costs a few milliseconds on the request path). A small write (at most
  one batch of ids) whose stack already has a message waiting sends none: that message's task tops
  its batch up from the stack's backlog (memories.search.embedding_jobs, `fill`), which holds this
  write's rows, and sends the stack's next message if rows remain (`queue_stack_embedding`). So the
  queue holds at most one small message per stack; under the soak one message per write made it
  grow without bound, most messages finding their rows already embedded, while the backlog itself
  shrank (docs/algorithms.md §10.2.1). A broker that cannot be reached is logged, never
  raised into a committed write: the rows keep `embedded_version IS NULL` and the periodic
  embedding sweep embeds them. The task is sent by name, so this module does not import
  `memories.tasks` (and through it the search and lifecycle rooms).

Today nothing registers a transform (redaction is called, not registered), and the only listeners
are the lifecycle jobs' own while they run (memories.lifecycle.jobs: each school's share of a
run); otherwise both lists are empty and cost one loop each.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from celery import current_app
from redis.exceptions import RedisError

from accounts.authors import AGENT_LABEL_MAX, Author
from accounts.throttles import redis_client
from memories.models import Memory, MemoryKind
from memories.privacy.redaction.engine import redact_memory, redact_secrets, redact_text
from memories.privacy.redaction.policy import RedactionPolicy
from memories.records.normalize import NormalizedMemory, normalize_memory
from memories.writes.effects import EMBED, NOTIFY, Committed, Write, queue, register_effect
from memories.writes.outbox import MEMORY, Statement, record_change

logger = logging.getLogger(__name__)

EMBED_TASK = "memories.embed_memories"  # memories.tasks.embed_memories
EMBED_MESSAGE_IDS = 500
# Native batch creates (up to 500 items) are split finer, as before the kernel: a client's batch is then
# embedded by every worker process at once instead of by one.
SMALL_EMBED_MESSAGE_IDS = 64
# A write of at most SMALL_EMBED_MESSAGE_IDS ids (one batch of the embedder) is "small": it
# coalesces with a message of its stack that is already waiting.
_QUEUED_PREFIX = "mh:embed:queued:"  # a stack's waiting message; the task deletes it when it starts
# If a message is lost after its marker was set (the process died between the two), the stack's
# small writes send nothing until this expires; the sweep embeds their rows meanwhile.
QUEUED_MARKER_SECONDS = 120
# A large write's messages do not coalesce (one per 500 ids of a push, per 64 of a native batch),
# and while embedding waits out a flood they are what the queue holds: compressed (Celery's
# per-message `compression`, which the worker undoes by the message's header), they take less of
# the broker's memory (docs/algorithms.md §10.2.1).
LARGE_MESSAGE_COMPRESSION = "zlib"

Transform = Callable[[NormalizedMemory], NormalizedMemory]


@dataclass(frozen=True)
class MemoryChange:
    """What one committed write did to one stack's memories."""

    stack_id: int
    action: str  # create | update | forget | recover | protect | unprotect | delete | …
    memory_ids: tuple[str, ...]
    source: str  # api | sync | ingest | promotion | decay | recall | …


Listener = Callable[[MemoryChange], None]

_transforms: list[Transform] = []
_listeners: list[Listener] = []


def register_transform(transform: Transform) -> None:
    """Apply `transform` to every payload from now on (after those registered before it)."""
    if transform not in _transforms:
        _transforms.append(transform)


def unregister_transform(transform: Transform) -> None:
    if transform in _transforms:
        _transforms.remove(transform)


def register_listener(listener: Listener) -> None:
    """Call `listener` after every committed write from now on."""
    if listener not in _listeners:
        _listeners.append(listener)


def unregister_listener(listener: Listener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


def prepare_memory(kind: str, payload: Any, *, redaction: RedactionPolicy, partial: bool = False,
                   existing: Memory | None = None, natural_key_optional: bool = False) -> NormalizedMemory:
    """THE way a payload becomes storable: `memories.records.normalize.normalize_memory` (its contract, its
    errors), then redaction under the stack's school's policy (`memories.privacy.redaction.engine.redact_memory`:
    `RedactionRefused`, 422, for a CRITICAL secret), then every registered transform.

    `redaction` is required, not defaulted: every writer resolves its school's choice
    (`memories.privacy.redaction.policy.stack_policy`, once per request or batch) instead of silently getting
    another one.

    Redaction is called here, not registered: it must hold for every process and every path
    whatever the registry holds (a worker or command that writes before the app registry is
    ready, a test that empties the list), and it must run before any other transform sees the text."""
    submitted = normalize_memory(kind, payload, partial=partial, existing=existing,
                                 natural_key_optional=natural_key_optional)
    normalized = redact_memory(submitted, redaction)
    for transform in _transforms:
        normalized = transform(normalized)
    if normalized is not submitted and submitted.kind == MemoryKind.RAW and normalized.text != submitted.text:
        # A raw entry redaction changed: its text as submitted, less every secret (an original keeps
        # the PII the school redacts, never a key, token or card number), goes along — never stored
        # as is; the writer seals it when the school opted in (memories.privacy.originals). When that is the
        # stored text (only secrets were redacted), no copy: what is stored IS the original.
        original = redact_secrets(submitted.text)
        if original != normalized.text:
            normalized = dataclasses.replace(normalized, original_text=original)
    return normalized


def prepare_author(author: Author, *, redaction: RedactionPolicy) -> Author:
    """THE way a write's author becomes storable (docs/privacy.md "Provenance"): its agent label —
    sent by the client (`X-Agent-Id`, the MCP client's name), so text like any other — redacted
    under the stack's school's policy, as `prepare_memory` redacts a memory (`RedactionRefused`, 422,
    for a CRITICAL secret). The rest is ours (a key's id and name, the person, the path) and holds no
    secret. Every kernel writer passes the result as the `author` of its rows and revisions."""
    if not author.agent:
        return author
    # A placeholder may be longer than what it replaced: the stored label keeps the label's limit.
    agent = redact_text(author.agent, field="agent", policy=redaction)[:AGENT_LABEL_MAX]
    return author if agent == author.agent else dataclasses.replace(author, agent=agent)


def after_commit(*, stack_id: int, source: str, changes: Iterable[tuple[str, Sequence[Any]]] = (),
                 embed_ids: Sequence[Any] = (), embed_message_ids: int = EMBED_MESSAGE_IDS,
                 along: Sequence[Statement | None] = ()) -> None:
    """Note one write, inside its transaction: record its change event (`outbox.record_change`:
    one outbox row per transaction and stack, published after commit), run the write's own
    statements (`along`: its INSERT of new rows, `rows.counters_statement`, None for one it does not
    need; in the same round trip as the event's INSERT), and queue its after-commit unit
    (`effects.queue`): embedding of `embed_ids`, then one `MemoryChange` per (action, memory ids) for
    the listeners. Nothing happens after commit if the transaction (or the savepoint the write ran
    in) rolls back; outside a transaction it happens at once."""
    changed = [(action, ids) for action, ids in changes if ids]
    statements = [statement for statement in along if statement is not None]
    if changed or statements:
        record_change(stack_id=stack_id, topic=MEMORY, source=source, changes=changed, along=statements)
    if not embed_ids and not changed:
        return
    queue(Committed(writes=(Write(
        stack_id=stack_id, source=source,
        changes=tuple((action, tuple(str(i) for i in ids)) for action, ids in changed),
        embed_ids=tuple(str(i) for i in embed_ids), embed_message_ids=embed_message_ids),)))


def _embed_effect(unit: Committed) -> None:
    for write in unit.writes:
        if write.embed_ids:
            _send_embedding(list(write.embed_ids), write.embed_message_ids, stack_id=write.stack_id)


def _notify_effect(unit: Committed) -> None:
    if not _listeners:
        return
    for write in unit.writes:
        for action, ids in write.changes:
            _notify(MemoryChange(stack_id=write.stack_id, action=action, memory_ids=ids, source=write.source))


register_effect(_embed_effect, stage=EMBED)
register_effect(_notify_effect, stage=NOTIFY)


def queue_stack_embedding(stack_id: int, ids: Sequence[str]) -> None:
    """Send `ids` (rows of one stack awaiting a vector) unless the stack has a message waiting;
    the embedding task calls this for what its batch could not take. Not in eager mode, where the
    task runs inside this call: a large backlog would recurse once per batch (the next write's task
    or the sweep takes the rest there)."""
    if current_app.conf.task_always_eager:
        return
    _send_embedding([str(i) for i in ids], SMALL_EMBED_MESSAGE_IDS, stack_id=stack_id)


def _queued_key(stack_id: int) -> str:
    return f"{_QUEUED_PREFIX}{int(stack_id)}"


def embedding_message_taken(stack_id: int) -> None:
    """A task for the stack has started: the stack's next small write sends a message again (its
    rows may be committed after this task read the backlog)."""
    try:
        redis_client(write=True).delete(_queued_key(stack_id))
    except RedisError as exc:  # Redis down: the marker expires by itself
        logger.warning("could not clear the embedding marker (%s)", type(exc).__name__)


def _send_embedding(ids: list[str], message_ids: int, *, stack_id: int | None = None) -> None:
    app = current_app
    # Only a small write's message stands for its stack (its task clears the marker).
    stands_for = stack_id if stack_id is not None and len(ids) <= SMALL_EMBED_MESSAGE_IDS else None
    try:
        if stands_for is not None and not redis_client(write=True).set(
                _queued_key(stands_for), 1, nx=True, ex=QUEUED_MARKER_SECONDS):
            return  # the stack's waiting message takes these rows from its backlog
        kwargs = {"stack_id": stands_for} if stands_for is not None else {}
        compression = None if stands_for is not None else LARGE_MESSAGE_COMPRESSION
        for start in range(0, len(ids), message_ids):
            chunk = ids[start:start + message_ids]
            if app.conf.task_always_eager:  # send_task ignores eager mode; run it here as .delay() would
                if EMBED_TASK not in app.tasks:  # task modules are imported when a worker starts
                    app.loader.import_default_modules()
                app.tasks[EMBED_TASK].apply(args=(chunk,), kwargs=kwargs)
            else:
                # ignore_result: the result is never read; without it the producer also subscribes
                # to the task's result channel.
                app.send_task(EMBED_TASK, args=(chunk,), kwargs=kwargs, ignore_result=True,
                              compression=compression)
    except Exception as exc:  # broker down: the sweep is the safety net
        logger.warning("could not queue embedding (%s); the sweep will pick it up", type(exc).__name__)
        if stands_for is not None:  # no message waits for the stack: let the next write try
            embedding_message_taken(stands_for)


def _notify(change: MemoryChange) -> None:
    for listener in list(_listeners):
        try:
            listener(change)
        except Exception:  # the write has committed; a listener must not turn it into an error
            logger.exception("memory change listener %r failed", listener)
