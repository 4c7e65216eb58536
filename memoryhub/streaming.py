"""Streaming a large download chunk by chunk under both servers (docs/operations.md §6).

Views hand StreamingHttpResponse a synchronous iterator of byte chunks (`streamed_content`), which
reads the database lazily (server-side cursors). Under WSGI the server's request thread iterates it
and then closes the response (`request_finished`), as for any response. Under ASGI the handler
(memoryhub.asgi) gives the body a `BodyThread`: one thread of its own that pulls every chunk, one
at a time as the client takes them, and then closes the response and its database connections.

WHY one thread, and closing there: Django's connections are per thread, and `request_finished`
returns only the connection of the thread it runs on. Reading a body on one thread and closing the
response on another left each download's connection checked out of the pool for good: after the
pool's size of downloads a web process answered every request 503 (pool timeout).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor

from django.db import connections
from django.http import HttpRequest, StreamingHttpResponse


def streamed_content(request: HttpRequest, chunks: Iterator[bytes]) -> Iterator[bytes]:
    """What to give StreamingHttpResponse for `chunks`: the iterator itself, under both servers.

    A synchronous iterator is what both handlers stream one chunk at a time (the ASGI one through a
    `BodyThread`); GZipMiddleware compresses it as one gzip stream."""
    return chunks


class BodyThread:
    """One streaming response's body, read and closed on one thread of its own (ASGI only).

    `attach()` replaces the response's content with an async iterator that pulls each chunk of the
    original (synchronous) one on this thread; `close()` then closes the response there (its
    iterator, `request_finished`) and closes what is left of the thread's database connections,
    because the thread ends with the body. Call `close()` whatever happened: the body read to its
    end, failed, or the client went away."""

    def __init__(self, response: StreamingHttpResponse) -> None:
        self.response = response
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="http-body")
        self._chunks: Iterator[bytes] = iter(response.streaming_content)  # type: ignore[arg-type]

    def attach(self) -> None:
        self.response.streaming_content = self._pulled()

    async def _pulled(self) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        while (chunk := await loop.run_in_executor(self._thread, next, self._chunks, None)) is not None:
            yield chunk

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            # Shielded: a cancelled request must still give its connection back; the close waits
            # behind a chunk being read at that moment (the thread does one thing at a time).
            await asyncio.shield(loop.run_in_executor(self._thread, self._close_here))
        finally:
            self._thread.shutdown(wait=False)

    def _close_here(self) -> None:
        try:
            self.response.close()  # the iterator's close (its cursor) and request_finished, on this thread
        finally:
            connections.close_all()  # without a pool, request_finished keeps a connection for reuse
