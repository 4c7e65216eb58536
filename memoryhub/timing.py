"""Where a request's time went, in its response's `Server-Timing` header (docs/operations.md §13).

    Server-Timing: app;dur=57.3, cpu;dur=8.9, db;dur=31.0;desc="5 statements"

* `app`: milliseconds from this middleware's start to the response (the web server's own reading
  and writing of the request are outside it);
* `cpu`: the CPU time of the thread that served it, in that span;
* `db`: milliseconds inside database statements (through Django's cursors), and how many.

What is left of `app` after `cpu` and `db` is time the request waited for something else: a core,
the interpreter's lock held by another request of the same process, Redis. Browsers show the
header in their developer tools; `bench/soak.py` splits its slowest requests by it.

Only an authenticated caller gets it: to anyone else the split could tell what the answer hides
(a password reset that found an account runs more statements than one that did not). Durations and
a count only, nothing of what was asked or answered. `SERVER_TIMING=off` leaves the header out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection
from django.http import HttpRequest, HttpResponseBase

HEADER = "Server-Timing"


class _StatementClock:
    """A Django execute wrapper that adds up the wall time of the statements run through it."""

    __slots__ = ("seconds", "statements")

    def __init__(self) -> None:
        self.seconds = 0.0
        self.statements = 0

    def __call__(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.seconds += time.perf_counter() - started
            self.statements += 1


class ServerTimingMiddleware:
    """Times the rest of the middleware chain and the view, and sets the header on an authenticated
    caller's response (see the module docstring)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response
        self.enabled = settings.SERVER_TIMING

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if not self.enabled:
            return self.get_response(request)
        clock = _StatementClock()
        started, cpu_started = time.perf_counter(), time.thread_time()
        with connection.execute_wrapper(clock):
            response = self.get_response(request)
        app_ms = (time.perf_counter() - started) * 1000
        cpu_ms = (time.thread_time() - cpu_started) * 1000
        if not _authenticated(request):
            return response
        plural = "" if clock.statements == 1 else "s"
        response[HEADER] = (f"app;dur={app_ms:.1f}, cpu;dur={cpu_ms:.1f}, "
                            f'db;dur={clock.seconds * 1000:.1f};desc="{clock.statements} statement{plural}"')
        return response


def _authenticated(request: HttpRequest) -> bool:
    """Whether the request was served to an authenticated caller. A dashboard session's user is
    read lazily; when a view never read it, that read happens here, and a database that fails it
    (the view's own answer was already a 503) means no header, not an error."""
    try:
        user = getattr(request, "user", None)
        return user is not None and bool(user.is_authenticated)
    except DatabaseError:
        return False
