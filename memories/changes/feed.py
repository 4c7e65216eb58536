"""Reading the change feed (docs/architecture.md §11): what an event looks like to its consumers,
and a stack's events after a seq, for a live page that resumes."""

from __future__ import annotations

from datetime import UTC
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

from memories.models import ChangeEvent, Memory
from memoryhub.database import ModelRows
from stacks.models import Stack

_EVENT_TABLE = ChangeEvent._meta.db_table


def event_dict(event: ChangeEvent, stack_slug: str) -> dict[str, Any]:
    """EVENT_DICT: what websocket clients get and a webhook's `data` — ids, never memory text."""
    return {"id": event.pk, "stack": stack_slug, "seq": event.seq, "topic": event.topic, "action": event.action,
            "source": event.source, "memory_ids": [str(i) for i in event.memory_ids],
            "at": event.created_at.astimezone(UTC).isoformat()}


_EVENT_ROWS = ModelRows(ChangeEvent)
# Every live socket reads it for every change it sends: written out, so that none of them builds
# and compiles a queryset for it (docs/architecture.md §11). Only the model's own table and column
# names are interpolated.
_EVENTS_AFTER_SQL = (f"SELECT {_EVENT_ROWS.columns} FROM {_EVENT_ROWS.table}"  # noqa: S608
                     " WHERE stack_id = %s AND seq > %s AND seq <= %s ORDER BY seq LIMIT %s")
_LAST_SEQ = 2**63 - 1  # bigint's largest: "no upper bound"


def events_after(stack: Stack | int, seq: int, limit: int = 500, through: int | None = None) -> list[ChangeEvent]:
    """The stack's events with seq > `seq` (and <= `through`, when given), oldest first, at most
    `limit`: a resume's catch-up, and a live socket's events up to the one just published."""
    stack_id = stack if isinstance(stack, int) else stack.pk
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute(_EVENTS_AFTER_SQL, [stack_id, seq, _LAST_SEQ if through is None else through, max(0, limit)])
        return [_EVENT_ROWS.instance(row) for row in cursor.fetchall()]


def latest_seq(stack: Stack | int) -> int:
    """The stack's newest change sequence number (its events', or its rows' when newer): a page
    reads it before its content and resumes from it with `events_after`."""
    stack_id = stack if isinstance(stack, int) else stack.pk
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute(
            f"SELECT GREATEST((SELECT max(seq) FROM {_EVENT_TABLE} WHERE stack_id = %s), "  # noqa: S608
            f"(SELECT max(change_seq) FROM {Memory._meta.db_table} WHERE stack_id = %s), 0)", [stack_id, stack_id])
        return int(cursor.fetchone()[0])
