"""Websocket consumers: the probe (a Celery worker answers a ping through the channel layer), and
the answer for a path no route serves.

Every websocket passes memoryhub.limits.WebsocketGuard first (a message rate and size limit per
connection) and the origin check; the probe then asks for a signed-in dashboard session.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from asgiref.sync import sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from memoryhub.tasks import ping_websocket

# A ping waits this long for its pong before another may be sent; the task expires with it, so a
# backlog of pings never reaches a worker that comes back late.
PING_TIMEOUT_SECONDS = 30
CLOSE_NOT_FOUND = 4404


class ProbeConsumer(AsyncJsonWebsocketConsumer):
    """Exposes no data: each connection gets a private group that only its own pings reach.

    Only for a signed-in session (an anonymous handshake is refused), and one ping in flight per
    connection: a client sending pings faster than the worker answers gets `ping_pending` back
    instead of a Celery task per message."""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close()  # before accept: the server refuses the handshake (HTTP 403)
            return
        self.group = f"probe.{uuid.uuid4().hex}"
        self.pending_since: float | None = None
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not isinstance(content, dict) or content.get("action") != "ping":
            await self.send_json({"error": {"code": "unknown_action", "message": "send {\"action\": \"ping\"}"}})
            return
        now = time.monotonic()
        if self.pending_since is not None and now - self.pending_since < PING_TIMEOUT_SECONDS:
            await self.send_json({"error": {"code": "ping_pending",
                                            "message": "a ping is already on its way; wait for its pong"}})
            return
        self.pending_since = now
        # Off the event loop: publishing to the broker is blocking I/O.
        await sync_to_async(ping_websocket.apply_async, thread_sensitive=False)(
            (self.group,), expires=PING_TIMEOUT_SECONDS)

    async def probe_pong(self, event: dict[str, Any]) -> None:
        self.pending_since = None
        await self.send_json({"type": "pong", "source": event["source"]})

    async def receive(self, text_data: str | None = None, **kwargs: Any) -> None:
        """Binary frames (`bytes_data`) and text that is not JSON get the unknown-action answer, not
        the base class's ValueError and a traceback."""
        try:
            content = json.loads(text_data) if text_data else None
        except ValueError:
            content = None
        await self.receive_json(content)


async def websocket_not_found(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A websocket to a path no route serves: the handshake is refused (HTTP 403 from the server,
    code 4404 where the server passes it on), instead of the router's "No route found" exception —
    an HTTP 500 and a traceback in the log."""
    message = await receive()
    if message["type"] == "websocket.connect":
        await send({"type": "websocket.close", "code": CLOSE_NOT_FOUND})
