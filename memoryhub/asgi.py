"""ASGI entry point: HTTP through Django, websockets through Channels (origin- and auth-checked), and
MCP at /mcp (agents/mcp_server.py), whose session manager runs from lifespan startup to shutdown.

In front of both, memoryhub/limits.py: request bodies over the limit are refused with 413 before
they are read (`RequestBodyLimit`), and every websocket has a message rate and size limit
(`WebsocketGuard`).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.core import signals
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.db import close_old_connections
from django.http import HttpResponseBase, StreamingHttpResponse
from django.urls import set_script_prefix

from memoryhub.after_response import run_after_response, take_after_response
from memoryhub.lanes import too_late_response
from memoryhub.streaming import BodyThread

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memoryhub.settings")


class SingleHopASGIHandler(ASGIHandler):
    """Django's ASGI handler, serving each HTTP request in ONE hop to a reused worker thread.

    WHY: every view here is synchronous (DRF, the dashboard). Stock Django builds an *async*
    middleware chain under ASGI and wraps each sync middleware hook, the view, the request
    signals and `response.close()` in their own `sync_to_async`, on a thread created for every
    request: about fifteen event-loop ↔ thread hops per request with our eight middleware, which
    measured as most of the gap between a request served in-process and over HTTP (bench/
    http_overhead.py). Here the request runs exactly as under a threaded WSGI server: one worker
    thread sends `request_started`, runs the sync middleware chain and view, and closes the
    response (`request_finished` returns the DB connection to the pool) before the event loop
    writes the already-rendered bytes. Same middleware, same order, same signals; the thread's
    DB connection is the view's for the whole request and is released before the next one.
    A streaming response (a download) is the exception: its body reads the database as the client
    takes it, on a thread of its own that also closes it (`_send_streamed`).

    Threads: at most twice the DB pool size per process — a thread beyond the pool could only
    wait for a connection, and waiters past the pool's timeout still fail as 503.
    """

    def __init__(self) -> None:
        super().__init__()
        from django.conf import settings

        pool_size = int(getattr(settings, "DB_POOL_MAX_SIZE", 0) or 16)
        self._executor = ThreadPoolExecutor(max_workers=max(4, 2 * pool_size), thread_name_prefix="http")
        self._deadline = float(settings.LANES_INTERACTIVE_DEADLINE_SECONDS)

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)

    def _serve(self, scope: dict[str, Any], body_file: Any,
               queued_at: float) -> tuple[HttpResponseBase, list[Callable[[], None]]]:
        if time.monotonic() - queued_at > self._deadline:
            # Shed before the work, not after: its client has waited past any interactive use.
            return too_late_response(), []
        set_script_prefix(get_script_prefix(scope))
        signals.request_started.send(sender=self.__class__, scope=scope)
        try:
            request, error_response = self.create_request(scope, body_file)
            response = self.get_response(request) if request is not None else error_response
            assert response is not None  # create_request returns a request or an error response
            response._handler_class = self.__class__  # type: ignore[attr-defined]
            after: list[Callable[[], None]] = []
            if not response.streaming:
                # Closed before its bytes are written: what the request left for after its response
                # (memoryhub.after_response) is taken off it, to run once they are.
                after = take_after_response(response)
                response.close()  # fires request_finished on THIS thread: its connection goes back
            else:
                # The body is read and the response closed on another thread (`_send_streamed`):
                # this thread's part is over, so its connection goes back now, as
                # request_finished would return it (the close there returns only that thread's).
                close_old_connections()
        except BaseException:
            signals.request_finished.send(sender=self.__class__)
            raise
        return response, after

    @staticmethod
    def _after_sent(callbacks: list[Callable[[], None]]) -> None:
        """Run a sent response's after-response work, then return this thread's connection."""
        try:
            run_after_response(callbacks)
        finally:
            close_old_connections()

    async def handle(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        from django.core.exceptions import RequestAborted

        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        loop = asyncio.get_running_loop()
        # No context copy on purpose: the request runs in its worker thread's own context, like a
        # threaded WSGI server. Django keeps cache clients in context-locals, so a fresh context
        # per request (what stock Django does) builds a new Redis client — a new TCP connection
        # — on every request; per thread, the throttle's Redis connection is reused. Per-request
        # state is set per request (script prefix above, urlconf in get_response).
        try:
            response, after = await loop.run_in_executor(self._executor, self._serve, scope, body_file,
                                                         time.monotonic())
            if isinstance(response, StreamingHttpResponse) and not response.is_async:
                await self._send_streamed(response, receive, send)
                return
            try:
                await self.send_response(response, send)
            except asyncio.CancelledError:
                pass  # client went away while we were writing; nothing left to do
            finally:
                if response.streaming:
                    await loop.run_in_executor(self._executor, response.close)
                if after:
                    await loop.run_in_executor(self._executor, self._after_sent, after)
        finally:
            body_file.close()

    async def _send_streamed(self, response: StreamingHttpResponse, receive: Any, send: Any) -> None:
        """Send a streaming response whose body is read from the database as it goes (a download).

        The body is pulled chunk by chunk, and the response closed, on one thread of its own
        (memoryhub.streaming.BodyThread): `request_finished` then returns the very connection the
        body read with. A client that goes away stops the reading at the next chunk."""
        body = BodyThread(response)
        body.attach()
        sending = asyncio.ensure_future(self.send_response(response, send))
        listening = asyncio.ensure_future(self.listen_for_disconnect(receive))
        try:
            await asyncio.wait((sending, listening), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (listening, sending):
                task.cancel()
            await asyncio.gather(listening, sending, return_exceptions=True)
            await body.close()
        failure = None if sending.cancelled() else sending.exception()
        if failure is not None:
            raise failure  # a body that failed mid-way: the server cuts the connection, the client sees it cut


def _django_http_app() -> Any:
    import django

    django.setup(set_prefix=False)
    return SingleHopASGIHandler()


django_asgi_app = _django_http_app()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs Django set up first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from accounts.authentication import request_credential_verifies  # noqa: E402
from agents.mcp_server import MCP_PATHS, endpoint  # noqa: E402
from memoryhub.limits import RequestBodyLimit, WebsocketGuard  # noqa: E402
from memoryhub.routing import websocket_urlpatterns  # noqa: E402


class McpOrDjango:
    """HTTP to `/mcp` (and `/mcp/`) goes to the MCP endpoint (agents/mcp_server.py), the rest to Django."""

    def __init__(self, mcp: Any, django_app: Any) -> None:
        self.mcp = mcp
        self.django_app = django_app

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        app = self.mcp if scope.get("path") in MCP_PATHS else self.django_app
        await app(scope, receive, send)


class WithLifespan:
    """The outermost app: answers ASGI lifespan events itself and passes everything else on.

    WHY: the MCP session manager needs a task group that lives from startup to shutdown, and
    neither Django's handler nor Channels' router takes lifespan events. Startup enters the MCP
    endpoint's `running()`, shutdown leaves it, in the same task (as an async context manager must).
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        message = await receive()
        if message["type"] != "lifespan.startup":
            return
        started = False
        try:
            async with endpoint.running():
                await send({"type": "lifespan.startup.complete"})
                started = True
                while (await receive())["type"] != "lifespan.shutdown":
                    pass
        except Exception as exc:
            failed = "lifespan.shutdown.failed" if started else "lifespan.startup.failed"
            await send({"type": failed, "message": f"MCP endpoint: {type(exc).__name__}"})
            return
        await send({"type": "lifespan.shutdown.complete"})


application = WithLifespan(ProtocolTypeRouter(
    {
        "http": RequestBodyLimit(McpOrDjango(endpoint, django_asgi_app),
                                 credential_verifies=request_credential_verifies),
        "websocket": WebsocketGuard(AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))),
    }
))


def _load_for_life() -> None:
    """Import every view now (Django would on the first request), freeze what this process keeps
    for life out of the garbage collector's walks and shorten the GIL's switch interval
    (memoryhub/interpreter.py)."""
    from django.urls import get_resolver

    from memoryhub.interpreter import settle_heap, shorten_gil_switch_interval

    get_resolver().url_patterns  # noqa: B018 - the attribute access imports the whole URL conf
    settle_heap()
    shorten_gil_switch_interval()


_load_for_life()
