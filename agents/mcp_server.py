"""MCP over streamable HTTP at `/mcp` (docs/architecture.md §12).

* The official `mcp` package's session manager serves the protocol, in STATELESS mode with JSON
  responses: every POST is answered on its own (no session id, no server-held stream), so any web
  process behind a load balancer can serve any call, and nothing is lost when one restarts. Any
  other method (a GET asking for an event stream, a DELETE ending a session) is a 405 with
  `Allow: POST`, before authentication.
* Authentication is the REST API's: `Authorization: Bearer <knl_sk_ key or JWT>` goes through
  accounts.authentication.BearerAuthentication (the same key lookup, back-off on failed guesses,
  expiry and revocation), on a worker thread, before the request reaches the MCP transport. A
  missing or bad credential is the REST 401 (429 while backing off), in the REST error body.
* Host and Origin are checked by the transport (its DNS-rebinding protection), with the hosts of
  ALLOWED_HOSTS and the origins of those hosts and CSRF_TRUSTED_ORIGINS.
* The session manager needs a running task group, started by ASGI lifespan events: `running()` is
  entered by the outer router of memoryhub.asgi on `lifespan.startup`. Without lifespan events
  (`uvicorn --lifespan off`) /mcp answers 503 and says so; everything else works as before.
* The agent label of a call (docs/privacy.md "Provenance") is the MCP client's `clientInfo.name`.
  A client on protocol 2026-07-28 or later sends it with every request. An older one sends it only
  with `initialize`, which a stateless server cannot keep; so the answer to `initialize` carries it
  back as the `Mcp-Session-Id` (signed with the server's secret, holding nothing else), which the
  client sends with every later request of its session, to whichever process serves it. Without
  either, the REST API's `X-Agent-Id` header names the agent (or none does).
* The tools (agents/mcp_tools.py) are synchronous Django code; each call runs on a worker thread
  between `request_started` and `request_finished`, as a REST request does, so its database
  connection goes back to the pool when the call ends.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import mcp_types as types
from django.conf import settings
from django.core import signals, signing
from django.http import HttpRequest
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from rest_framework.request import Request

from accounts.authentication import BearerAuthentication
from accounts.authors import AGENT_HEADER, AGENT_LABEL_MAX
from accounts.principal import Principal
from agents.mcp_tools import call_tool, tools_for
from memoryhub.errors import NotAuthenticated, api_exception_handler, error_body

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Any]
Send = Callable[[Message], Any]
T = TypeVar("T")

MCP_PATHS = frozenset({"/mcp", "/mcp/"})
PRINCIPAL_KEY = "memoryhub.principal"  # where the authenticated Principal rides in the ASGI scope
CLIENT_NAME_KEY = "memoryhub.client_name"  # the client name the request's session id carries
SESSION_HEADER = b"mcp-session-id"
_SESSION_SALT = "memoryhub.mcp.client-name"
_INITIALIZE_MAX_BYTES = 64 * 1024  # an initialize request is small; a larger body is not one
INSTRUCTIONS = (
    "MemoryHub: long-term memory for this agent. Start a session with memory_load (checkpoint, boot config and "
    "the most important memories within a token budget); memory_search before answering from memory; "
    "memory_remember what is worth keeping; checkpoint_save before stopping. With a school key, name the stack "
    "in every call."
)


# --- on a worker thread ---------------------------------------------------------------------------

def _as_request(func: Callable[..., T], *args: Any) -> T:
    """Run Django code the way a REST request runs: `request_started` / `request_finished` around it
    (old connections closed before; this thread's connection returned to the pool after)."""
    signals.request_started.send(sender=McpEndpoint)
    try:
        return func(*args)
    finally:
        signals.request_finished.send(sender=McpEndpoint)


def _authenticate(scope: Scope) -> Principal:
    """The caller's Principal from its Bearer credential, by the REST API's own authentication (a
    request carrying only what it reads: the Authorization header and the client address)."""
    request = HttpRequest()
    for name, value in scope.get("headers", []):
        key = name.decode("latin-1").lower()
        if key in ("authorization", "x-forwarded-for"):
            request.META["HTTP_" + key.upper().replace("-", "_")] = value.decode("latin-1")
    client = scope.get("client")
    request.META["REMOTE_ADDR"] = client[0] if client else ""
    result = BearerAuthentication().authenticate(Request(request))
    if result is None:
        raise NotAuthenticated("Authentication credentials were not provided.")
    return result[1]


# --- the MCP server -------------------------------------------------------------------------------

def _principal(ctx: ServerRequestContext[Any, Any]) -> Principal:
    request = ctx.request
    principal = request.scope.get(PRINCIPAL_KEY) if request is not None else None
    if not isinstance(principal, Principal):  # only reachable if the transport were mounted without us
        raise RuntimeError("MCP request without an authenticated principal")
    return principal


def _session_name(name: str) -> str:
    """The session id that carries a client's name (`initialize` → every later request)."""
    return signing.dumps(name[:AGENT_LABEL_MAX + 1], salt=_SESSION_SALT, compress=True)


def _named_by_session(scope: Scope) -> str | None:
    """The client name the request's `Mcp-Session-Id` carries, if it is one of ours."""
    for name, value in scope.get("headers", []):
        if name.lower() == SESSION_HEADER:
            try:
                named = signing.loads(value.decode("latin-1"), salt=_SESSION_SALT)
            except (signing.BadSignature, UnicodeDecodeError, ValueError):
                return None
            return named if isinstance(named, str) else None
    return None


def _initialize_name(body: bytes) -> str | None:
    """`params.clientInfo.name` of an `initialize` request body, else None."""
    if len(body) > _INITIALIZE_MAX_BYTES or b'"initialize"' not in body:
        return None
    try:
        message = json.loads(body)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("method") != "initialize":
        return None
    info = (message.get("params") or {}).get("clientInfo") if isinstance(message.get("params"), dict) else None
    name = info.get("name") if isinstance(info, dict) else None
    return name if isinstance(name, str) and name else None


def _naming_session(receive: Receive, send: Send) -> tuple[Receive, Send]:
    """`receive` and `send` that, for an `initialize` request, answer with the session id carrying
    the client's name (`_session_name`); any other request passes through unchanged."""
    body = bytearray()

    async def receiving() -> Message:
        message = await receive()
        if message.get("type") == "http.request" and len(body) <= _INITIALIZE_MAX_BYTES:
            body.extend(message.get("body", b""))
        return message

    async def sending(message: Message) -> None:
        if message.get("type") == "http.response.start":
            name = _initialize_name(bytes(body))
            if name is not None:
                message = {**message, "headers": [*message.get("headers", []),
                                                  (SESSION_HEADER, _session_name(name).encode("ascii"))]}
        await send(message)

    return receiving, sending


def _client_name(ctx: ServerRequestContext[Any, Any]) -> Any:
    """The calling client's name as it sent it, unchecked (`call_tool` validates it): `clientInfo.name`
    when this request carries the client's info, else the one its session id carries, else the
    `X-Agent-Id` header, else None."""
    params = ctx.session.client_params if ctx.session is not None else None
    if params is not None and params.client_info is not None:
        return params.client_info.name
    if ctx.request is None:
        return None
    named = ctx.request.scope.get(CLIENT_NAME_KEY)
    return named if named is not None else ctx.request.headers.get(AGENT_HEADER)


def _tool(tool: Any) -> types.Tool:
    return types.Tool(name=tool.name, description=tool.description, input_schema=tool.input_schema)


class McpEndpoint:
    """The ASGI app of /mcp: authenticate, then hand the request to the MCP session manager."""

    def __init__(self) -> None:
        self.server: Server[Any] = Server(
            "memoryhub", version="1", instructions=INSTRUCTIONS,
            on_list_tools=self._list_tools, on_call_tool=self._call_tool,
        )
        self.manager: StreamableHTTPSessionManager | None = None
        self.limiter: anyio.CapacityLimiter | None = None

    async def _list_tools(self, ctx: ServerRequestContext[Any, Any],
                          params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[_tool(tool) for tool in tools_for(_principal(ctx))])

    async def _call_tool(self, ctx: ServerRequestContext[Any, Any],
                         params: types.CallToolRequestParams) -> types.CallToolResult:
        base_url = str(ctx.request.base_url).rstrip("/") if ctx.request is not None else ""
        outcome = await self._in_thread(call_tool, _principal(ctx), params.name, params.arguments, base_url,
                                        _client_name(ctx))
        return types.CallToolResult(content=[types.TextContent(text=outcome.text())],
                                    structured_content=outcome.payload, is_error=outcome.is_error)

    async def _in_thread(self, func: Callable[..., T], *args: Any) -> T:
        return await anyio.to_thread.run_sync(_as_request, func, *args, limiter=self.limiter)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Serve /mcp while this is entered (the ASGI lifespan: startup to shutdown)."""
        manager = StreamableHTTPSessionManager(app=self.server, json_response=True, stateless=True,
                                               security_settings=transport_security())
        # As many tool calls at once as the HTTP handler has threads (memoryhub.asgi): beyond the
        # database pool they could only wait for a connection.
        self.limiter = anyio.CapacityLimiter(max(4, 2 * int(getattr(settings, "DB_POOL_MAX_SIZE", 0) or 16)))
        async with manager.run():
            self.manager = manager
            try:
                yield
            finally:
                self.manager = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = str(scope.get("method", ""))
        if method != "POST":
            # Stateless: every exchange is one POST. There is no session to end (DELETE) and nothing
            # to push on a server-to-client stream (GET), which the transport would otherwise hold
            # open for ever, one per request: refused before anything else, as the spec allows (405).
            await _send_json(send, 405, error_body("method_not_allowed", f'Method "{method}" not allowed.'),
                             [(b"allow", b"POST")])
            return
        manager = self.manager
        if manager is None:
            await _send_json(send, 503, error_body(
                "service_unavailable", "The MCP endpoint is not running: the server was started without ASGI "
                                       "lifespan events (run uvicorn with --lifespan on)."))
            return
        try:
            principal = await self._in_thread(_authenticate, scope)
        except Exception as exc:  # 401 / 429 / 503 in the REST error body, never a 500
            # The REST API's own mapping, headers included (WWW-Authenticate, Retry-After).
            response = api_exception_handler(exc, {})
            headers = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in response.items()
                       if name.lower() in ("www-authenticate", "retry-after")]
            await _send_json(send, response.status_code, dict(response.data or {}), headers)
            return
        receive, send = _naming_session(receive, send)
        await manager.handle_request({**scope, PRINCIPAL_KEY: principal, CLIENT_NAME_KEY: _named_by_session(scope)},
                                     receive, send)


def transport_security() -> TransportSecuritySettings:
    """The transport's Host/Origin checks, from ALLOWED_HOSTS (any port) and CSRF_TRUSTED_ORIGINS.

    Django's `*` (any host) turns the Host check off, as it does for Django; a leading-dot pattern
    (`.example.org`) admits the domain itself here, not its subdomains (the transport matches exact
    names): list subdomains that serve /mcp explicitly."""
    hosts = [host.lstrip(".") for host in settings.ALLOWED_HOSTS]
    if "*" in hosts:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    allowed_hosts = [pattern for host in hosts for pattern in (host, f"{host}:*")]
    origins = [f"{scheme}://{pattern}" for scheme in ("http", "https") for pattern in allowed_hosts]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=allowed_hosts,
                                     allowed_origins=[*origins, *settings.CSRF_TRUSTED_ORIGINS])


async def _send_json(send: Send, status: int, body: dict[str, Any],
                     headers: list[tuple[bytes, bytes]] | None = None) -> None:
    content = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(content)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": content})


endpoint = McpEndpoint()
