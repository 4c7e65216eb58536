"""Limits at the edge, before a request's content reaches any view or consumer (docs/operations.md §6).

* `RequestBodyLimit` — ASGI middleware around the HTTP app. A body over the limit is refused with
  413 before it is read past the limit: a declared Content-Length over it is refused without
  reading a byte; a body of unknown length (chunked) is counted as it streams and cut off at the
  limit. A stranger may send `MAX_UNAUTHENTICATED_REQUEST_BYTES`; the routes anyone may call
  without a credential (register, the logins) take no more from anyone. Elsewhere a request whose
  credential (Bearer header or session cookie) *verifies* may send up to `MAX_REQUEST_BYTES`
  (`DATA_UPLOAD_MAX_MEMORY_SIZE`): the credential is checked — by the app's own authentication,
  on a worker thread — only once the body would pass the stranger's limit, so small requests
  cost nothing extra. A bogus credential gets the stranger's limit (413), and a check that cannot
  be made (database or Redis down) a 503: a stranger can make the server hold at most that much.
* `BoundedJSONParser` — DRF's JSON parser, bounded: it reads at most the body limit (so the cap
  holds under any server, the test client's WSGI handler included), refuses JSON nested deeper
  than `JSON_MAX_DEPTH` or holding a string longer than `JSON_MAX_STRING_CHARS` with a 400
  (`json_too_deep`, `json_string_too_long`), the decoder's own RecursionError included.
* `WebsocketGuard` — ASGI middleware around every websocket: at most `WEBSOCKET_MESSAGE_BURST`
  messages at once, refilled at `WEBSOCKET_MESSAGES_PER_SECOND`, each at most
  `WEBSOCKET_MAX_MESSAGE_CHARS`; past either the connection is closed with a code that says which
  (4429 rate, 1009 size) and the consumer sees an ordinary disconnect.

Settings are read per request / per connection (one attribute lookup), so a test's override holds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from itertools import compress
from typing import Any

from django.conf import settings
from django.db import close_old_connections
from django.http import HttpRequest
from django.http.cookie import parse_cookie
from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser, JSONParser
from rest_framework.utils.json import strict_constant

from memoryhub.errors import InvalidInput, PayloadTooLarge, error_body
from memoryhub.metrics import WEBSOCKETS_OPEN
from memoryhub.outage import retry_after_seconds

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
# Does the request (headers and client address only) carry a credential that authenticates?
# Synchronous (it may read the database); memoryhub/asgi.py passes accounts' check.
CredentialCheck = Callable[[HttpRequest], bool]

# Routes served to anyone, without a credential: their bodies are a few hundred bytes.
UNAUTHENTICATED_PATHS = frozenset({"/auth/register", "/auth/login", "/login", "/admin/login"})

JSON_MAX_DEPTH = 64  # a sync push is ~5 levels deep, a record's own nesting at most 20 (records.cleaning.clean_json)
JSON_MAX_STRING_CHARS = 1024 * 1024  # the longest field a record may hold is 100,000 characters

WEBSOCKET_MESSAGES_PER_SECOND = 2.0
WEBSOCKET_MESSAGE_BURST = 20
WEBSOCKET_MAX_MESSAGE_CHARS = 64 * 1024
CLOSE_RATE_LIMITED = 4429  # application range (4000-4999), read as HTTP's 429
CLOSE_TOO_BIG = 1009  # RFC 6455: message too big


# --- HTTP bodies -------------------------------------------------------------------------------------

class _BodyTooLarge(Exception):
    """Raised from the counting `receive` once a streamed body passes the limit."""


class _CheckFailed(Exception):
    """Raised from the counting `receive` when the credential could not be checked."""


def larger_limit(path: str, has_credential: bool) -> int | None:
    """What a request to `path` may send once its credential verifies, or None: the stranger's
    limit is all it may ever send (no credential, or a route served to anyone)."""
    if not has_credential or path.rstrip("/") in UNAUTHENTICATED_PATHS:
        return None
    return int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)


def _too_large_body(limit: int) -> bytes:
    message = f"The request body is larger than {limit:,} bytes."
    return json.dumps(error_body("payload_too_large", message, {"body": [f"At most {limit:,} bytes."]})).encode()


_CREDENTIAL_HEADERS = {b"authorization": ",", b"x-forwarded-for": ",", b"cookie": "; "}


def credential_request(scope: Scope) -> HttpRequest:
    """A request carrying only what a credential check reads: the credential headers (repeated
    ones joined as Django joins them) and the client address."""
    request = HttpRequest()
    request.method = scope.get("method")
    request.path = scope["path"]
    for name, value in scope["headers"]:
        joiner = _CREDENTIAL_HEADERS.get(name)
        if joiner is not None:
            key = "HTTP_" + name.decode("latin-1").upper().replace("-", "_")
            text = value.decode("latin-1")
            request.META[key] = f"{request.META[key]}{joiner}{text}" if key in request.META else text
    client = scope.get("client")
    request.META["REMOTE_ADDR"] = client[0] if client else ""
    request.COOKIES = parse_cookie(request.META.get("HTTP_COOKIE", ""))
    return request


def _check_on_this_thread(check: CredentialCheck, request: HttpRequest) -> bool:
    # As a request does: connections left over are closed first, this thread's goes back after.
    close_old_connections()
    try:
        return check(request)
    finally:
        close_old_connections()


class RequestBodyLimit:
    """ASGI middleware: 413 for a body over the limit, never reading past it (see the module doc).

    Cost per request: one pass over the header list; the body is counted only when its length
    was not declared (or Transfer-Encoding is present: a declared length can then not be trusted).
    A declared length is enforced by the HTTP server itself, which never hands over more. The
    credential is checked only for a body past the stranger's limit (at most once a request)."""

    def __init__(self, app: ASGIApp, *, credential_verifies: CredentialCheck) -> None:
        self.app = app
        self.credential_verifies = credential_verifies

    async def _verifies(self, scope: Scope) -> bool:
        """The credential check, on a worker thread (it may wait for the database)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, _check_on_this_thread, self.credential_verifies,
                                          credential_request(scope))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared: int | None = None
        streamed = has_credential = False
        session_cookie = settings.SESSION_COOKIE_NAME.encode() + b"="
        for name, value in scope["headers"]:
            if name == b"content-length":
                declared = int(value) if value.isdigit() else None
            elif name == b"transfer-encoding":
                streamed = True
            elif name == b"authorization" or (name == b"cookie" and session_cookie in value):
                has_credential = True
        limit = int(settings.MAX_UNAUTHENTICATED_REQUEST_BYTES)
        larger = larger_limit(scope["path"], has_credential)
        if declared is not None and declared > limit:
            if larger is None or declared > larger:
                await _refuse(send, limit if larger is None else larger)
                return
            try:
                verified = await self._verifies(scope)
            except Exception as exc:
                await _check_unavailable(send, exc)
                return
            if not verified:  # a bogus credential: the stranger's limit, the body never read
                await _refuse(send, limit)
                return
            limit, larger = larger, None
        if declared is not None and not streamed:
            await self.app(scope, receive, send)
            return

        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received, limit, larger
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit and larger is not None:
                    grow, larger = larger, None  # checked once: either way, no second check
                    try:
                        verified = await self._verifies(scope)
                    except Exception as exc:
                        raise _CheckFailed from exc
                    if verified:
                        limit = grow
                if received > limit:
                    raise _BodyTooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _BodyTooLarge:
            if not started:  # Django reads the whole body before it answers: always the case here
                await _refuse(send, limit)
        except _CheckFailed as failed:
            if not started:
                await _check_unavailable(send, failed.__cause__)


async def _refuse(send: Send, limit: int) -> None:
    await _answer(send, 413, _too_large_body(limit))


async def _check_unavailable(send: Send, exc: BaseException | None) -> None:
    """503 with Retry-After: the credential could not be checked (the database or Redis is down),
    so the body is neither taken nor refused as too large. Logged by type only: no credential."""
    logger.warning("credential check for the body limit failed: %s", type(exc).__name__)
    body = json.dumps(error_body("service_unavailable", "The credential could not be checked; retry shortly.")).encode()
    await _answer(send, 503, body, [(b"retry-after", str(retry_after_seconds("the credential check")).encode())])


async def _answer(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    # `connection: close`: the rest of the body is never read, so the connection cannot carry
    # another request; the server closes it once the answer is written.
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


# --- JSON ----------------------------------------------------------------------------------------------

_IS_CONTAINER = frozenset({dict, list}).__contains__
_IS_STRING = frozenset({str}).__contains__


def _too_deep() -> InvalidInput:
    return InvalidInput("The JSON body is nested too deeply.", code="json_too_deep",
                        fields={"body": [f"At most {JSON_MAX_DEPTH} levels of nesting."]})


def _string_too_long() -> InvalidInput:
    return InvalidInput("The JSON body holds a string that is too long.", code="json_string_too_long",
                        fields={"body": [f"Strings are at most {JSON_MAX_STRING_CHARS:,} characters."]})


def json_shape_problem(data: Any, *, body_bytes: int, openers: int,
                       bound_strings: bool = True) -> InvalidInput | None:
    """Why a parsed JSON value is refused (too deep, too long a string — unless `bound_strings` is
    False), or None.

    Walks level by level with C-level filters (`compress` over `map(type, …)`), so even the
    largest push stays cheap, and skipped where the body cannot break a limit — fewer opening
    brackets than the depth limit, fewer bytes than the string limit."""
    check_depth = openers > JSON_MAX_DEPTH
    check_strings = bound_strings and body_bytes > JSON_MAX_STRING_CHARS
    if not (check_depth or check_strings):
        return None
    level: list[Any] = [data] if _IS_CONTAINER(type(data)) else []
    if check_strings and isinstance(data, str) and len(data) > JSON_MAX_STRING_CHARS:
        return _string_too_long()
    depth = 1
    while level:
        if depth > JSON_MAX_DEPTH:
            return _too_deep()
        children: list[Any] = []
        strings: list[str] = []
        for value in level:
            items = list(value.values()) if type(value) is dict else value
            children.extend(compress(items, map(_IS_CONTAINER, map(type, items))))
            if check_strings:
                if type(value) is dict:
                    strings.extend(value)
                strings.extend(compress(items, map(_IS_STRING, map(type, items))))
        if strings and max(map(len, strings)) > JSON_MAX_STRING_CHARS:
            return _string_too_long()
        level = children
        depth += 1
    return None


class BoundedBodyParser(BaseParser):
    """A raw (non-JSON) body, read to at most `max_bytes()` + 1 bytes: the view refuses a body over
    its limit without the rest ever being read (teleport's tar.gz uploads)."""

    def max_bytes(self) -> int:
        raise NotImplementedError

    def parse(self, stream: Any, media_type: str | None = None,  # type: ignore[override]  # bytes, not a mapping
              parser_context: Mapping[str, Any] | None = None) -> bytes:
        return stream.read(self.max_bytes() + 1) if stream is not None else b""


class BoundedJSONParser(JSONParser):
    """DRF's JSONParser with the body cap, a depth and a string bound (see the module doc).

    Lone surrogates (`"\\ud800"`) parse as before: they are one record's defect, refused where the
    record is validated (memories/records/), so one bad operation never sinks a sync push."""

    bound_strings = True  # refuse a string over JSON_MAX_STRING_CHARS (see SyncPushJSONParser)

    def parse(self, stream: Any, media_type: str | None = None,
              parser_context: Mapping[str, Any] | None = None) -> Any:
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        limit = int(settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise PayloadTooLarge(f"The request body is larger than {limit:,} bytes.", code="payload_too_large",
                                  fields={"body": [f"At most {limit:,} bytes."]})
        try:
            data = json.loads(raw.decode(encoding), parse_constant=strict_constant if self.strict else None)
        except RecursionError:  # the C decoder's own bound, ~1,000 levels
            raise _too_deep() from None
        except ValueError as exc:  # bad JSON, bad encoding (UnicodeDecodeError), NaN / Infinity
            raise ParseError(f"JSON parse error - {exc}") from None
        problem = json_shape_problem(data, body_bytes=len(raw), openers=raw.count(b"{") + raw.count(b"["),
                                     bound_strings=self.bound_strings)
        if problem is not None:
            raise problem
        return data


class SyncPushJSONParser(BoundedJSONParser):
    """The sync pushes' parser: the body cap and the depth bound, but no string bound. A string too
    long for a record is that one operation's refusal (memories/records/ bounds every field), which
    the push answers and acknowledges; refusing the whole body instead would leave every operation
    of the batch queued on the device, re-sent unchanged on every push (docs/kernle-protocol.md
    §3.11). The body cap still bounds what is read."""

    bound_strings = False


# --- websockets ------------------------------------------------------------------------------------------

class _TokenBucket:
    def __init__(self, capacity: float, per_second: float) -> None:
        self.capacity = capacity
        self.per_second = per_second
        self.tokens = capacity
        self.at = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.per_second)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class WebsocketGuard:
    """ASGI middleware: a per-connection message rate and size limit for every websocket route.

    Past a limit the guard itself closes the socket (4429 or 1009, with a reason) and hands the
    consumer a `websocket.disconnect`, so it cleans up as for any disconnect; anything the consumer
    still sends afterwards is dropped instead of failing in the server."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        bucket = _TokenBucket(float(getattr(settings, "WEBSOCKET_MESSAGE_BURST", WEBSOCKET_MESSAGE_BURST)),
                              float(getattr(settings, "WEBSOCKET_MESSAGES_PER_SECOND", WEBSOCKET_MESSAGES_PER_SECOND)))
        max_chars = int(getattr(settings, "WEBSOCKET_MAX_MESSAGE_CHARS", WEBSOCKET_MAX_MESSAGE_CHARS))
        closed = False

        async def guarded_receive() -> Message:
            nonlocal closed
            message = await receive()
            if message["type"] != "websocket.receive" or closed:
                return message
            size = len(message.get("text") or "") + len(message.get("bytes") or b"")
            if size > max_chars:
                code, reason = CLOSE_TOO_BIG, f"message larger than {max_chars} characters"
            elif not bucket.take():
                code, reason = CLOSE_RATE_LIMITED, "message rate limit exceeded"
            else:
                return message
            closed = True
            await send({"type": "websocket.close", "code": code, "reason": reason})
            return {"type": "websocket.disconnect", "code": code}

        accepted = False

        async def guarded_send(message: Message) -> None:
            nonlocal accepted
            if not closed:
                await send(message)
                if message["type"] == "websocket.accept" and not accepted:
                    accepted = True
                    WEBSOCKETS_OPEN.inc()

        try:
            await self.app(scope, guarded_receive, guarded_send)
        finally:
            if accepted:
                WEBSOCKETS_OPEN.dec()
