"""Work a request leaves for after its response has been sent (docs/architecture.md §5.6).

`after_response(response, func)` queues `func` on `response`. It runs once the client has the
response, never before, whatever serves it:

* under the ASGI handler (memoryhub/asgi.py), which closes a rendered response on its worker thread
  *before* the event loop writes its bytes, the handler takes the queue off the response first
  (`take_after_response`) and runs it on a worker thread after the last byte was sent, then returns
  that thread's database connection;
* anywhere else (the WSGI server, a streamed download, Django's test client) the queue runs when the
  response is closed, which those do once it has been sent (a stream: once it ended).

A callback that raises is logged by type and the others still run: the response has been sent, so
a failure can no longer change it. What a callback must not lose is its own business (it logs a
count of what it could not do, never content).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.http.response import HttpResponseBase

logger = logging.getLogger(__name__)

_QUEUE = "_memoryhub_after_response"


def after_response(response: HttpResponseBase, func: Callable[[], None]) -> None:
    """Run `func` once `response` has been sent (see the module docstring)."""
    queued: list[Callable[[], None]] | None = getattr(response, _QUEUE, None)
    if queued is None:
        queued = []
        setattr(response, _QUEUE, queued)
        # Django calls a response's closers when it is closed, before `request_finished`.
        closers: list[Callable[[], None]] = getattr(response, "_resource_closers")  # noqa: B009 - not in the stubs
        closers.append(lambda: run_after_response(take_after_response(response)))
    queued.append(func)


def take_after_response(response: HttpResponseBase) -> list[Callable[[], None]]:
    """The callbacks queued on `response`, removed from it: the caller now runs them, once sent."""
    queued: list[Callable[[], None]] = list(getattr(response, _QUEUE, None) or ())
    setattr(response, _QUEUE, [])
    return queued


def run_after_response(callbacks: list[Callable[[], None]]) -> None:
    for func in callbacks:
        try:
            func()
        except Exception as exc:  # the response is out: log and go on with the rest
            logger.error("after-response work failed (%s)", type(exc).__name__)
