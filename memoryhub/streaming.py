"""Streaming a large download chunk by chunk under both servers.

Under ASGI Django reads a synchronous iterator given to StreamingHttpResponse to its end, into
memory, before it sends the first byte. `streamed_content` hands ASGI an async iterator that pulls
one chunk at a time on the request's thread instead (thread_sensitive: a server-side cursor stays
on the connection that opened it), and WSGI the iterator as it is.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest


async def _pulled_one_by_one(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    def step() -> bytes | None:
        return next(chunks, None)

    pull = sync_to_async(step, thread_sensitive=True)
    while True:
        chunk = await pull()
        if chunk is None:
            return
        yield chunk


def streamed_content(request: HttpRequest, chunks: Iterator[bytes]) -> Iterator[bytes] | AsyncIterator[bytes]:
    """What to give StreamingHttpResponse for `chunks` in this request's server."""
    return _pulled_one_by_one(chunks) if isinstance(request, ASGIRequest) else chunks
