"""Recording the access log: who was served which memory ids of a stack, when and through which
path (docs/privacy.md "Access log").

Contract:

* `record_access(stack_id=, author=, path=, memory_ids=)` is the one call every content-serving read
  makes, once it knows the ids it serves. Nothing is recorded when the log is off
  (`settings.MEMORYHUB_ACCESS_LOG`) or no id was served. Only ids, the reader's `Author` and the path
  are kept: never any memory text.
* Inside an HTTP request (`AccessLogMiddleware`), the rows wait until the response is produced and
  are written in one INSERT once it has been sent (memoryhub.after_response; a stream: once it
  ended), so the write never delays the answer. One row per request, stack, path and reader,
  whatever the number of memories (no per-memory write amplification). A request answered with an
  error records nothing: nothing was served.
* Inside `access_batch()` (an MCP tool call), the rows are written when the block ends.
* Anywhere else (a websocket push, a webhook delivery) the row is written at once.
* A row that cannot be written is logged as a count with the error's type, never its content; the
  response has been sent by then and stands.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.utils import timezone

from accounts.authors import Author, Path, author_of, request_author
from accounts.principal import Principal, principal_of
from memories.models import MemoryAccess
from memoryhub.after_response import after_response

logger = logging.getLogger(__name__)


class AccessPath:
    """What kind of read served the memories (`MemoryAccess.path`); the reader's own channel (api,
    kernle, mcp, dashboard) is the author's `path`."""

    SEARCH = "search"
    LOAD = "load"
    GET = "get"
    LIST = "list"
    MEMORY_MD = "memory_md"
    EXPORT = "export"
    PULL = "pull"
    MCP = "mcp"
    DASHBOARD = "dashboard"
    LIVE = "live"
    WEBHOOK = "webhook"

    ALL = (SEARCH, LOAD, GET, LIST, MEMORY_MD, EXPORT, PULL, MCP, DASHBOARD, LIVE, WEBHOOK)


_AuthorKey = tuple[tuple[str, Any], ...]


class PendingAccesses:
    """The accesses of one request or batch: ids merged per (stack, path, reader), in first-served order."""

    def __init__(self, reader: Author | None = None) -> None:
        self.reader = reader  # who a batch serves, when its caller knows (an MCP call: the client's name)
        self._rows: dict[tuple[int, str, _AuthorKey], dict[str, None]] = {}
        self._authors: dict[_AuthorKey, Author] = {}

    def add(self, stack_id: int, author: Author, path: str, memory_ids: Iterable[str]) -> None:
        author_key = tuple(sorted(author.as_json().items()))
        self._authors.setdefault(author_key, author)
        ids = self._rows.setdefault((stack_id, path, author_key), {})
        for memory_id in memory_ids:
            ids[memory_id] = None

    def __bool__(self) -> bool:
        return any(self._rows.values())

    def rows(self) -> list[MemoryAccess]:
        now = timezone.now()
        return [_row(stack_id, self._authors[author_key], path, list(ids), now)
                for (stack_id, path, author_key), ids in self._rows.items() if ids]

    def flush(self) -> None:
        """Write the rows (once); a failure is logged as a count, never with the rows' content."""
        rows = self.rows()
        self._rows.clear()
        _write(rows)


_pending: ContextVar[PendingAccesses | None] = ContextVar("memoryhub_access_log", default=None)


def access_log_enabled() -> bool:
    return bool(getattr(settings, "MEMORYHUB_ACCESS_LOG", True))


def _ids(memory_ids: Iterable[uuid.UUID | str]) -> list[str]:
    # The ids of rows just read from our own table, so already canonical: as text, the form the
    # INSERT sends them in (parsing each into a UUID and printing it again cost a load of a few
    # hundred memories more than the rest of its access row).
    return [str(value) for value in memory_ids]


def _row(stack_id: int, author: Author, path: str, memory_ids: list[str], at: Any) -> MemoryAccess:
    return MemoryAccess(stack_id=stack_id, at=at, path=path, author=author.as_json(), agent=author.agent,
                        key_id=author.key_id, user_id=author.user_id, memory_ids=memory_ids)


_TABLE = MemoryAccess._meta.db_table
_ROW_SQL = "(%s, %s, %s, %s::jsonb, %s, %s, %s, %s::uuid[])"


def _write(rows: list[MemoryAccess]) -> None:
    """One INSERT statement for all the rows: a single round trip, no BEGIN / COMMIT (bulk_create
    would wrap it in a transaction of its own)."""
    if not rows:
        return
    params: list[Any] = []
    for row in rows:
        # The ids as one array literal: psycopg adapting a list of UUIDs one by one costs far more
        # (docs/benchmarks.md "Figures behind code choices").
        ids = "{" + ",".join(map(str, row.memory_ids)) + "}"
        params += [row.stack_id, row.at, row.path, json.dumps(row.author), row.agent, row.key_id, row.user_id, ids]
    sql = (f"INSERT INTO {_TABLE} (stack_id, at, path, author, agent, key_id, user_id, memory_ids) "  # noqa: S608
           "VALUES " + ", ".join([_ROW_SQL] * len(rows)))
    # Inside a caller's transaction (a row written at once), a savepoint: a failed INSERT must not
    # break the caller's transaction. Otherwise the statement is its own transaction: no BEGIN/COMMIT.
    scope = transaction.atomic() if connection.in_atomic_block else nullcontext()
    try:
        with scope, connection.cursor() as cursor:
            cursor.execute(sql, params)
    except Exception as exc:  # the response has been sent: say how many rows were lost, not what they held
        logger.error("access log: %d row(s) not written (%s)", len(rows), type(exc).__name__)


def record_access(*, stack_id: int, author: Author, path: str, memory_ids: Iterable[uuid.UUID | str]) -> None:
    """Record that `author` was served `memory_ids` of stack `stack_id` through `path` (see the module
    docstring for when the row is written)."""
    if not access_log_enabled():
        return
    ids = _ids(memory_ids)
    if not ids:
        return
    pending = _pending.get()
    if pending is not None:
        pending.add(stack_id, author, path, ids)
    else:
        _write([_row(stack_id, author, path, ids, timezone.now())])


def record_request_access(request: Any, *, stack_id: int, path: str, memory_ids: Iterable[uuid.UUID | str],
                          via: str = Path.API) -> None:
    """`record_access` for a REST request: the reader is the request's principal with its `X-Agent-Id`
    label, reached through `via` (Path.API or Path.KERNLE)."""
    if access_log_enabled():
        author = request_author(request, principal_of(request), path=via)
        record_access(stack_id=stack_id, author=author, path=path, memory_ids=memory_ids)


def record_principal_access(principal: Principal, *, via: str, stack_id: int, path: str,
                            memory_ids: Iterable[uuid.UUID | str]) -> None:
    """`record_access` for a signed-in person or a credential without a request's headers (the
    dashboard, its live sockets, MCP when its layer names no agent): the reader is `principal` via `via`."""
    if access_log_enabled():
        record_access(stack_id=stack_id, author=author_of(principal, path=via), path=path, memory_ids=memory_ids)


def batch_reader() -> Author | None:
    """The reader the enclosing `access_batch` was opened for, if any."""
    pending = _pending.get()
    return pending.reader if pending is not None else None


@contextmanager
def access_batch(reader: Author | None = None) -> Iterator[PendingAccesses]:
    """Collect the accesses recorded inside the block and write them when it ends (the rows of a block
    that raised too: what was served before the error was served). `reader`: who the block serves
    (`batch_reader`)."""
    pending = PendingAccesses(reader)
    token = _pending.set(pending)
    try:
        yield pending
    finally:
        _pending.reset(token)
        pending.flush()


class AccessLogMiddleware:
    """Collects a request's accesses and writes them once its response has been sent."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        pending = PendingAccesses()
        token = _pending.set(pending)
        try:
            response = self.get_response(request)
        finally:
            _pending.reset(token)
        if pending and response.status_code < 400:
            after_response(response, pending.flush)
        return response
