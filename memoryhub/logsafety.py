"""No memory text in our logs, even in a database error's traceback (docs/privacy.md "Logs").

A PostgreSQL error's message can carry stored values: a CHECK or NOT NULL violation's DETAIL is
"Failing row contains (…)" — the whole row, memory text included — and a unique violation's names
the key's values. `SafeFormatter` (settings.LOGGING) keeps a logged traceback's frames but writes a
database error, and every error it was raised from or during, as its type and SQLSTATE only; the
one exception is psycopg's own message about a statement's shape (`_SHAPE_MESSAGES`), which holds no
value and is what makes such a bug findable.
`WithholdDatabaseErrors` does the same for a message that quotes the error itself: Celery's
task-failure line ("Task … raised unexpected: %(exc)s"). The Celery worker logs through
settings.LOGGING too (memoryhub/celery.py), so both apply there.
"""

from __future__ import annotations

import logging
import traceback
from types import TracebackType
from typing import Any

from pythonjsonlogger.json import JsonFormatter

_Info = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]


def _is_database_error(exc: BaseException) -> bool:
    module = type(exc).__module__ or ""
    return module.startswith(("psycopg", "django.db"))


def _sqlstate(exc: BaseException | None) -> str | None:
    if exc is None:
        return None
    return getattr(getattr(exc, "diag", None), "sqlstate", None) or getattr(exc, "sqlstate", None)


# The messages psycopg itself raises, not PostgreSQL (no SQLSTATE), about a statement's shape, its
# parameters' types or its results' form: they quote our query templates, parameter names, type
# names and result statuses, never a value. Everything else stays withheld, psycopg's own messages
# included (a connection string's parse error can quote its password).
_SHAPE_MESSAGES = (
    "query parameter missing", "the query has ", "incomplete placeholder", "only '%s', '%b', '%t'",
    "positional and named placeholders", "placeholder '", "cannot adapt type", "cannot find a dumper",
    "cannot load sequence", "the last operation didn't produce", "no result available", "COPY cannot",
    "copy() should be used", "you cannot mix COPY",
)


def _shape_message(exc: BaseException | None) -> str | None:
    """psycopg's own message when `exc` is one of `_SHAPE_MESSAGES`' errors, else None."""
    if exc is None or _sqlstate(exc) is not None or type(exc).__module__.split(".")[0] != "psycopg":
        return None
    message = str(exc)
    return message if message.startswith(_SHAPE_MESSAGES) else None


def _safe_text(exc: BaseException) -> str:
    # Django wraps psycopg's error: the code is on the cause.
    cause = exc.__cause__ or exc.__context__
    sqlstate = _sqlstate(exc) or _sqlstate(cause)
    shape = _shape_message(exc) or _shape_message(cause)
    if shape is not None:
        return f"(raised by psycopg itself, not by PostgreSQL: {shape})"
    return f"(message withheld: it may hold stored values; SQLSTATE {sqlstate or 'unknown'})"


def safe_exception_text(exc_info: _Info) -> str:
    """The traceback as `logging` would write it, with database errors' messages withheld."""
    _, value, tb = exc_info
    if value is None:
        return ""
    rendered = traceback.TracebackException(type(value), value, tb, compact=True)
    # Walk the rendered chain and the exceptions together (both follow __cause__, else __context__).
    node: Any = rendered
    exc: BaseException | None = value
    seen: set[int] = set()
    while node is not None and exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if _is_database_error(exc):
            node._str = _safe_text(exc)  # the message line; everything else (frames, type) is kept
        if node.__cause__ is not None:
            node, exc = node.__cause__, exc.__cause__
        elif node.__context__ is not None and not node.__suppress_context__:
            node, exc = node.__context__, exc.__context__
        else:
            break
    return "".join(rendered.format()).rstrip("\n")


class SafeFormatter(logging.Formatter):
    """`logging.Formatter` whose tracebacks withhold database errors' messages."""

    def formatException(self, ei: Any) -> str:
        return safe_exception_text(ei)


class SafeJsonFormatter(JsonFormatter):
    """One JSON object per line (LOG_FORMAT=json, python-json-logger), tracebacks as above."""

    def formatException(self, ei: Any) -> str:
        return safe_exception_text(ei)


def _database_error_in(exc: BaseException | None) -> BaseException | None:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if _is_database_error(exc):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


class WithholdDatabaseErrors(logging.Filter):
    """A record logged with a database error whose message arguments quote it (Celery's `exc`):
    that argument becomes the error's type and SQLSTATE."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = _database_error_in(record.exc_info[1]) if record.exc_info else None
        if error is not None and isinstance(record.args, dict) and "exc" in record.args:
            record.args = {**record.args, "exc": f"{type(error).__name__} {_safe_text(error)}"}
        return True
