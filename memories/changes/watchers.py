"""Who is watching a stack's or a school's changes live (docs/architecture.md §11, "Only to groups
someone watches").

The publisher sends each change event to two channel-layer groups, the stack's and the school's.
Most of the time nobody has either page open, and a send to an empty group still costs the
channel layer's Redis round trips. So every socket that joins one of these groups counts itself
in Redis (`watch`, before it joins; `unwatch`, after it leaves), and the publisher asks `watched`,
one round trip for a whole batch, and sends only to groups with a watcher.

Nothing is missed by a page that opens while an event is published: it counts itself before it
joins the group and reads its catch-up from the database after joining, while the publisher reads
the counts after the event's commit. Either the publisher sees the count and sends, or the page's
catch-up reads the committed event. A process that dies with sockets open leaves its counts too
high: the publisher then sends to groups nobody watches, as it did before counting.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from redis.exceptions import RedisError

from accounts.throttles import redis_client

logger = logging.getLogger(__name__)

_KEY_PREFIX = "mh:live:watchers:"
# DECR, and remove the count when it reaches zero (or below: a count lost to a Redis restart).
_UNWATCH_LUA = "local n = redis.call('DECR', KEYS[1]) if n <= 0 then redis.call('DEL', KEYS[1]) end return n"


def stack_group(stack_id: int) -> str:
    """The channel-layer group a stack's change events are sent to."""
    return f"stack.{stack_id}"


def school_group(organization_id: int) -> str:
    """The channel-layer group every change of a school's stacks is sent to."""
    return f"school.{organization_id}"


def _key(group: str) -> str:
    return _KEY_PREFIX + group


def watch(groups: Iterable[str]) -> None:
    """Count one more watcher of each group; call before joining it (see the module doc)."""
    pipe = redis_client(write=True).pipeline(transaction=False)
    for group in groups:
        pipe.incr(_key(group))
    pipe.execute()


def unwatch(groups: Iterable[str]) -> None:
    """Count one watcher less of each group; call after leaving it."""
    pipe = redis_client(write=True).pipeline(transaction=False)
    for group in groups:
        pipe.eval(_UNWATCH_LUA, 1, _key(group))
    pipe.execute()


def watched(groups: Sequence[str]) -> set[str]:
    """The groups of `groups` that someone watches, in one round trip. If Redis cannot tell, all of
    them: a send too many costs a round trip, a send too few a page that misses a change."""
    if not groups:
        return set()
    try:
        # The primary's counts (write=True): a replica a moment behind could miss a page just opened.
        counts = redis_client(write=True).mget([_key(group) for group in groups])
    except RedisError as exc:
        logger.warning("could not read who watches the live groups (%s); sending to all", type(exc).__name__)
        return set(groups)
    return {group for group, count in zip(groups, counts, strict=True) if count is not None and int(count) > 0}
