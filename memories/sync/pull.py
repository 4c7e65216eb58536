"""Pull: the two entry points that read (kernle's `POST /sync/pull`, the native cursor pull).

Pulls wait for an in-flight push to the stack to commit (FOR SHARE on the stack row) and render
JSON without decoding records (see `_record_json`): a complete kernle change set of 10,000 records
is one query and string joins.

A credential other than the stack's own (a school key pulling a student's stack) gets only the
memories its privacy grants admit (memories.privacy.grants), filtered inside the query; its cursor still
advances past the hidden ones (kernle: the watermark; native: see `native_pull`). The stack's own
credentials run the same SQL as before, with no predicate.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from accounts.principal import Principal
from memories.models import ChangeEvent, SyncWatermark
from memories.privacy.grants import audience_for, grants_sql
from memories.records.cleaning import parse_timestamp
from memories.sync.protocol import (
    NATIVE_PAGE_DEFAULT,
    NATIVE_PAGE_MAX,
    PULL_TABLE_FOR_KIND,
    REQUIRED_FOR_PULL,
    bound_slug,
    cursor_decode,
    cursor_encode,
    not_reachable,
)
from memories.writes.columns import PAYLOAD_COLUMNS
from memories.writes.outbox import ERASE, PURGE
from memoryhub.database import async_commit_sql, skip_to_rows
from memoryhub.errors import InvalidInput
from stacks.models import Stack
from stacks.selectors import stack_for_principal, visible_stack
from stacks.services import stack_id_validated

# --- the stack a pull reads ------------------------------------------------------------------------------

def sync_stack_for_read(principal: Principal, raw_slug: Any) -> Stack | None:
    """The stack a kernle pull names, or None when it does not exist yet (an empty change set,
    docs/kernle-protocol.md §4.2). A stack-bound key naming another stack is a 404."""
    slug = stack_id_validated(raw_slug)
    stack = visible_stack(principal, slug)
    if stack is None:
        bound = bound_slug(principal)
        if bound is not None and bound != slug:
            raise not_reachable(principal, slug)
    return stack


# FOR SHARE on the stack row: waits for an in-flight push to commit, lets pulls run together.
_SHARE_LOCK_SQL = f"SELECT 1 FROM {Stack._meta.db_table} WHERE id = %(stack)s FOR SHARE;"  # noqa: S608


def _lock_stack_shared(stack: Stack) -> None:
    with connection.cursor() as cursor:
        cursor.execute(_SHARE_LOCK_SQL, {"stack": stack.pk})


# --- kernle pull ---------------------------------------------------------------------------------------

# Pulls are rendered without decoding records: Postgres hands over each record's `extra` and
# `data` as JSON text and the modelled columns as one json_build_object, and `_record_json` splices
# them into one object. A 10,000-record change set thus costs string joins, not 10,000
# decode/convert/encode round trips (nor jsonb concatenations in the database).
#
# Later keys override earlier ones for JSON readers (Python's json, httpx): extra < data < columns
# < sync block. By construction of memories.records.normalize the three sets are disjoint anyway.

# The Memory columns a client payload carries (memories.records.normalize.memory_payload_view's set).
_COLUMNS_JSON = "json_build_object(" + ", ".join(f"'{c}', m.{c}" for c in PAYLOAD_COLUMNS) + ")::text"
_TABLE_SQL = "CASE m.kind " + " ".join(f"WHEN '{k}' THEN '{t}'" for k, t in PULL_TABLE_FOR_KIND.items()) + " END"
# A 0.15.0 device cannot apply these without their natural key (§3.9); stored, never pulled.
_APPLIABLE_SQL = " AND ".join(
    f"NOT (m.kind = '{kind}' AND btrim(COALESCE(m.data ->> '{key}', '')) = '')"
    for kind, key in REQUIRED_FOR_PULL.items()
)
# Built from module constants only; every value is a bound parameter. `{grants}` is filled by
# `_kernle_pull_sql`: nothing for the stack's own credentials, the grants predicate otherwise.
# `{since}`: the incremental pull's bound (`_SINCE_SQL`), or nothing.
_KERNLE_PULL_SQL = f"""
SELECT {_TABLE_SQL}, to_json(m.record_id)::text,
       CASE WHEN m.kind = 'episode' THEN COALESCE(m.data -> 'lessons', '[]'::jsonb)::text END,
       m.extra::text, m.data::text, {_COLUMNS_JSON},
       json_build_object('id', m.record_id, 'created_at', m.created_at,
                         'local_updated_at', COALESCE(m.client_updated_at, m.server_updated_at),
                         'cloud_synced_at', m.server_updated_at,
                         'version', COALESCE(m.client_version, 1))::text,
       to_json(COALESCE(m.client_updated_at, m.server_updated_at))::text,
       COALESCE(m.client_version, 1), m.id
FROM memories_memory m
WHERE m.stack_id = %(stack)s AND m.deleted_at IS NULL AND m.forgotten_at IS NULL
  AND m.kind IN ({", ".join(f"'{k}'" for k in PULL_TABLE_FOR_KIND)})
  {{since}} AND {_APPLIABLE_SQL} {{grants}}
ORDER BY m.change_seq
"""  # noqa: S608


_WATERMARK_TABLE = SyncWatermark._meta.db_table
# A pull is one query string, so one implicit transaction: the stack's share lock first (it waits for
# an in-flight push to commit and keeps the next from committing until the string is done); then the
# change set, which, under READ COMMITTED, takes its snapshot once the lock is granted, with the
# upsert of this credential's watermark to the database clock riding on it (a data-modifying CTE runs
# whether or not the query reads it); then that watermark read back: the pull's server time. Any
# change the snapshot missed commits after the lock is released, so after that clock reading
# (a writer reads the clock once it holds the stack's lock): no change is ever skipped
# (docs/kernle-protocol.md §4.4).
_WATERMARK_CTE = (
    f"WITH watermark AS (INSERT INTO {_WATERMARK_TABLE} (stack_id, credential_id, pulled_at) "  # noqa: S608
    "VALUES (%(stack)s, %(credential)s, clock_timestamp()) "
    "ON CONFLICT (credential_id, stack_id) DO UPDATE SET pulled_at = EXCLUDED.pulled_at) "
)
_PULL_CLOCK_SQL = (f";SELECT pulled_at FROM {_WATERMARK_TABLE} "  # noqa: S608
                   "WHERE credential_id = %(credential)s AND stack_id = %(stack)s")
# An incremental pull reads from the earlier of the client's clock and our record of its last read
# (its clock may be ahead of ours, and a commit may have raced its last pull), so no change is ever
# skipped; a watermark a concurrent pull of the same credential is just moving is read as it was:
# earlier. An uncorrelated subquery: the bound is computed once and walks the (stack, updated) index.
_SINCE_SQL = (
    "AND m.server_updated_at > least(%(since)s::timestamptz, "  # noqa: S608 (module constants only)
    f"(SELECT w.pulled_at FROM {_WATERMARK_TABLE} w "
    "WHERE w.credential_id = %(credential)s AND w.stack_id = %(stack)s))"
)


@cache
def _kernle_pull_sql(grants: str, *, incremental: bool) -> str:
    """The lock, the change set (everything unless `incremental`), the clock: one string."""
    changes = _KERNLE_PULL_SQL.replace("{since}", _SINCE_SQL if incremental else "").replace("{grants}", grants)
    return _SHARE_LOCK_SQL + _WATERMARK_CTE + changes + _PULL_CLOCK_SQL


def _record_json(*objects: str | None) -> str:
    """Splice JSON object texts into one object (later keys win for JSON readers)."""
    inner = [obj[1:-1] for obj in objects if obj and len(obj) > 2]
    return "{" + ", ".join(inner) + "}"


def _kernle_operation_json(row: tuple[Any, ...]) -> str:
    table, record_id, lessons, extra, data, columns, sync_block, local_updated_at, version, _ = row
    head = '{"lessons_learned": ' + lessons + "}" if lessons is not None else None
    return (f'{{"operation": "update", "table": "{table}", "record_id": {record_id}, '
            f'"local_updated_at": {local_updated_at}, "version": {version}, '
            f'"data": {_record_json(head, extra, data, columns, sync_block)}}}')


@dataclass
class KernlePullResult:
    operations_json: str  # a JSON array of pull operations, rendered without decoding records
    count: int
    server_time: datetime
    stack_id: int | None = None  # None: the stack does not exist (yet)
    memory_ids: list[uuid.UUID] = field(default_factory=list)  # what the operations carry (the access log)

    @property
    def operations(self) -> list[dict[str, Any]]:
        parsed: list[dict[str, Any]] = json.loads(self.operations_json)
        return parsed


def kernle_pull(*, principal: Principal, stack_id: Any, since: Any) -> KernlePullResult:
    """The complete change set since the client's clock (§4.2, §4.4). `since` absent or null: all;
    anything else must be an ISO-8601 timestamp, or the pull is a 400 `invalid_since` (§4.1).

    Two round trips: the stack (the access decision), then its share lock, the change set with the
    watermark's upsert and the clock as one query string (`_kernle_pull_sql`), no BEGIN / COMMIT."""
    since_time = _since(since)
    stack = sync_stack_for_read(principal, stack_id)
    if stack is None:
        return KernlePullResult(operations_json="[]", count=0, server_time=timezone.now())
    grants, grant_params = _grants_clause(principal, stack, alias="m")
    with connection.cursor() as cursor:
        # A watermark lost with the last moments before a crash only makes the next pull start from
        # an older one (records again, never a gap): the commit need not wait for the WAL flush.
        cursor.execute(async_commit_sql() + _kernle_pull_sql(grants, incremental=since_time is not None),
                       {"stack": stack.pk, "credential": principal.credential_id, "since": since_time, **grant_params})
        skip_to_rows(cursor)  # past the SET to the lock
        cursor.nextset()  # past the lock
        fetched = cursor.fetchall()
        cursor.nextset()
        now = cursor.fetchone()[0]
    rows = [_kernle_operation_json(row) for row in fetched]
    return KernlePullResult(operations_json="[" + ",".join(rows) + "]", count=len(rows), server_time=now,
                            stack_id=stack.pk, memory_ids=[row[-1] for row in fetched])


def _since(value: Any) -> datetime | None:
    """A kernle pull's `since`: None (absent or null) or an aware timestamp.

    An unreadable one is refused rather than read as absent: the client would silently receive (and
    re-apply, logging a conflict for each local edit) the whole stack, and the caller never learns
    its clock was not understood. kernle==0.15.0 sends `datetime.isoformat()` or nothing."""
    if value is None:
        return None
    parsed = parse_timestamp(value) if isinstance(value, str) else None
    if parsed is None:
        raise InvalidInput("since must be an ISO-8601 timestamp, or null for everything.", code="invalid_since",
                           fields={"since": ["An ISO-8601 timestamp (e.g. 2026-11-21T23:15:58+00:00) or null."]})
    return parsed


# --- native pull ---------------------------------------------------------------------------------------

# Built from module constants only; every value is a bound parameter. The page is cut first (the
# inner query walks the (stack, change_seq) index), then rendered. The inner query carries only the
# columns rendered: not the embedding (1.5 kB) nor the tsvector, which a page would otherwise copy
# through its Limit (and, on a small table where the planner prefers a sort, through the sort).
_NATIVE_PULL_COLUMNS = ", ".join((
    "change_seq", "deleted_at", "id", "kind", "record_id", "version", "client_version", "created_at",
    "client_updated_at", "server_updated_at", "forgotten_at", "extra", "data", *PAYLOAD_COLUMNS))
# A live memory is an upsert with its record; a deleted or forgotten one is a tombstone with ids
# only (`delete`, `forget`): a device drops its copy, and forgotten text never leaves the server.
_LIVE = "m.deleted_at IS NULL AND m.forgotten_at IS NULL"
_NATIVE_PULL_SQL = f"""
SELECT m.change_seq,
       json_build_object(
           'op', CASE WHEN m.deleted_at IS NOT NULL THEN 'delete'
                      WHEN m.forgotten_at IS NOT NULL THEN 'forget' ELSE 'upsert' END,
           'id', m.id, 'kind', m.kind, 'record_id', m.record_id, 'version', m.version,
           'client_version', m.client_version, 'created_at', m.created_at, 'updated_at', m.client_updated_at,
           'server_updated_at', m.server_updated_at, 'forgotten', m.forgotten_at IS NOT NULL,
           'forgotten_at', m.forgotten_at,
           'reason', CASE WHEN m.deleted_at IS NOT NULL THEN 'deleted'
                          WHEN m.forgotten_at IS NOT NULL THEN 'forgotten' END)::text,
       CASE WHEN {_LIVE} THEN m.extra::text END,
       CASE WHEN {_LIVE} THEN m.data::text END,
       CASE WHEN {_LIVE} THEN {_COLUMNS_JSON} END,
       CASE WHEN {_LIVE} THEN m.id END
FROM (SELECT {_NATIVE_PULL_COLUMNS} FROM memories_memory
      WHERE stack_id = %(stack)s AND change_seq > %(after)s {{grants}}
      ORDER BY stack_id, change_seq LIMIT %(limit)s) m
ORDER BY m.change_seq
"""  # noqa: S608


@cache
def _native_pull_sql(grants: str) -> str:
    return _NATIVE_PULL_SQL.replace("{grants}", grants)


# Memories removed outright (TTL and retention purges, erasures) leave no row to page by: their
# tombstones come from the change events that recorded the removal, ids only, under the event's seq
# (drawn under the stack lock like every change_seq, so they interleave in commit order).
# events_prune keeps these events (memories.changes.publish), so a device that pulls rarely still
# hears of every removal.
_TOMBSTONE_REASONS = {PURGE: "expired", ERASE: "erased"}
_NATIVE_TOMBSTONES_SQL = (
    f"SELECT seq, action, memory_ids, created_at FROM {ChangeEvent._meta.db_table} "  # noqa: S608 - constants
    "WHERE stack_id = %(stack)s AND seq > %(after)s AND topic = 'memory' AND action = ANY(%(actions)s) "
    "ORDER BY seq LIMIT %(limit)s")


def _tombstone_json(memory_id: str, reason: str, at: datetime) -> str:
    """A removed memory's tombstone: the keys of every change, the row's own ones null (it is gone)."""
    return json.dumps({"op": "delete", "id": memory_id, "kind": None, "record_id": None, "version": None,
                       "client_version": None, "created_at": None, "updated_at": None,
                       "server_updated_at": at.isoformat(), "forgotten": False, "forgotten_at": None,
                       "reason": reason, "data": {}})


@dataclass
class _Page:
    changes: list[str]
    rows: list[tuple[Any, ...]]  # the memory rows delivered
    last: int | None  # the seq of the last change delivered
    has_more: bool


def _merged_page(rows: list[tuple[Any, ...]], tombstones: list[tuple[Any, ...]], page_size: int) -> _Page:
    """Memory rows and removal events merged by seq, cut after `page_size` changes. One event's
    ids are never split across pages (the cursor is a seq), so a page may carry up to one purge or
    erasure batch more than `page_size`."""
    items = sorted([(row[0], True, row) for row in rows] + [(event[0], False, event) for event in tombstones],
                   key=lambda item: item[0])
    page = _Page(changes=[], rows=[], last=None, has_more=False)
    for seq, is_row, item in items:
        if len(page.changes) >= page_size:
            page.has_more = True
            break
        if is_row:
            page.changes.append(_native_change_json(item))
            page.rows.append(item)
        else:
            _, action, ids, at = item
            page.changes.extend(_tombstone_json(memory_id, _TOMBSTONE_REASONS[action], at) for memory_id in ids)
        page.last = seq
    return page


def _grants_clause(principal: Principal, stack: Stack, *, alias: str) -> tuple[str, dict[str, Any]]:
    """("AND <grants predicate>", params) for a credential other than the stack's own; ("", {}) for its own."""
    audience = audience_for(principal, stack_id=stack.pk)
    if audience is None:
        return "", {}
    sql, params = grants_sql(audience, alias)
    return f"AND {sql}", params


def _native_change_json(row: tuple[Any, ...]) -> str:
    _, envelope, extra, data, columns, _ = row
    return envelope[:-1] + ', "data": ' + _record_json(extra, data, columns) + "}"


@dataclass
class NativePullResult:
    changes_json: str  # a JSON array of changes, rendered without decoding records
    count: int
    next_cursor: str
    has_more: bool
    stack_id: int = 0
    memory_ids: list[uuid.UUID] = field(default_factory=list)  # the upserts' (the access log); not tombstones

    @property
    def changes(self) -> list[dict[str, Any]]:
        parsed: list[dict[str, Any]] = json.loads(self.changes_json)
        return parsed


@transaction.atomic
def native_pull(*, principal: Principal, stack_slug: str, cursor: str | None, limit: Any) -> NativePullResult:
    """One page of a stack's changes after `cursor`, oldest first (docs/api.md "Native sync"):
    live memories as upserts; deleted and forgotten ones, and memories purged or erased, as
    tombstones with ids only (`delete`, `forget`).

    Resuming with the returned `next_cursor` continues exactly after the last change delivered:
    the cursor is the `change_seq` of that change, and pushes stamp sequence numbers under the
    stack lock, which this read waits for (FOR SHARE), so no earlier number can commit later.
    For a credential the privacy grants apply to, hidden changes are skipped inside the query; on
    the last page the cursor moves to the stack's newest change, so the hidden ones at the end are
    not walked again on every pull (the cursor says nothing about them but a number).
    """
    after = cursor_decode(cursor)
    page_size = _page_size(limit)
    stack = stack_for_principal(principal, stack_slug)
    _lock_stack_shared(stack)
    grants, grant_params = _grants_clause(principal, stack, alias="")
    with connection.cursor() as db:
        db.execute(_native_pull_sql(grants), {"stack": stack.pk, "after": after, "limit": page_size + 1,
                                              **grant_params})
        rows = db.fetchall()
        db.execute(_NATIVE_TOMBSTONES_SQL, {"stack": stack.pk, "after": after, "limit": page_size + 1,
                                            "actions": list(_TOMBSTONE_REASONS)})
        page = _merged_page(rows, db.fetchall(), page_size)
        has_more = page.has_more
        last = after if page.last is None else page.last
        if grants and not has_more:
            db.execute("SELECT max(change_seq) FROM memories_memory WHERE stack_id = %s", [stack.pk])
            newest = db.fetchone()[0]
            last = max(last, newest or 0)
    return NativePullResult(changes_json="[" + ",".join(page.changes) + "]", count=len(page.changes),
                            next_cursor=cursor_encode(last), has_more=has_more, stack_id=stack.pk,
                            memory_ids=[row[-1] for row in page.rows if row[-1] is not None])


def _page_size(limit: Any) -> int:
    if limit in (None, ""):
        return NATIVE_PAGE_DEFAULT
    try:
        value = int(limit)
    except (TypeError, ValueError):
        raise InvalidInput("limit must be an integer.", fields={"limit": ["Must be an integer."]}) from None
    return max(1, min(NATIVE_PAGE_MAX, value))

