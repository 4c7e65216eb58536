"""Response compression: Django's GZipMiddleware, with whole responses compressed at the level the
deployment sets (`RESPONSE_GZIP_LEVEL`, docs/configuration.md).

Django compresses at gzip level 6. On the API's JSON that is a large share of a big response's web
CPU after the database (a load of a few hundred memories), and level 1 does the same job in a
fraction of the time for a slightly larger body (docs/benchmarks.md "Figures behind code choices");
it is nginx's default level too. 0 turns compression off, for a deployment whose proxy compresses.

Everything else is Django's rule: bodies under 200 bytes, bodies already encoded and clients that do
not accept gzip are left alone; a body is only replaced when the compressed one is shorter; `Vary`
names `Accept-Encoding`, a strong ETag becomes weak, and the gzip header carries a file name of
random length against BREACH. Streamed responses (exports, in the bulk lane) go through Django's
own path at level 6: they are large downloads, where the bytes over a school's network matter more.
"""

from __future__ import annotations

import gzip
import io
import secrets

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.middleware.gzip import GZipMiddleware as DjangoGZipMiddleware
from django.middleware.gzip import re_accepts_gzip
from django.utils.cache import patch_vary_headers

MIN_BODY_BYTES = 200  # Django's: shorter bodies are not worth compressing


def gzip_body(content: bytes, level: int, *, max_random_bytes: int) -> bytes:
    """`content` as one gzip member at `level`, its header naming a file of a random length from 1 to
    `max_random_bytes` characters (Django's `compress_string` draws 0 to `max_random_bytes` - 1; an
    empty name would leave the header without one)."""
    buffer = io.BytesIO()
    name = "a" * (1 + secrets.randbelow(max_random_bytes))
    with gzip.GzipFile(filename=name, mode="wb", compresslevel=level, fileobj=buffer, mtime=0) as body:
        body.write(content)
    return buffer.getvalue()


class GZipMiddleware(DjangoGZipMiddleware):
    def process_response(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        level = settings.RESPONSE_GZIP_LEVEL
        if level == 0:
            return response
        if not isinstance(response, HttpResponse):  # streamed (StreamingHttpResponse, FileResponse)
            return super().process_response(request, response)
        if len(response.content) < MIN_BODY_BYTES or response.has_header("Content-Encoding"):
            return response
        patch_vary_headers(response, ("Accept-Encoding",))
        if not re_accepts_gzip.search(request.META.get("HTTP_ACCEPT_ENCODING", "")):
            return response
        compressed = gzip_body(response.content, level, max_random_bytes=self.max_random_bytes)
        if len(compressed) >= len(response.content):
            return response
        response.content = compressed
        response.headers["Content-Length"] = str(len(compressed))
        etag = response.get("ETag")
        if etag and etag.startswith('"'):
            response.headers["ETag"] = "W/" + etag
        response.headers["Content-Encoding"] = "gzip"
        return response
