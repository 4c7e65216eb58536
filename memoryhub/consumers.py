"""A websocket probe: the client says ping, a Celery worker answers through the channel layer."""

from __future__ import annotations

import uuid
from typing import Any

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from memoryhub.tasks import ping_websocket


class ProbeConsumer(AsyncJsonWebsocketConsumer):
    """Exposes no data: each connection gets a private group that only its own pings reach."""

    async def connect(self) -> None:
        self.group = f"probe.{uuid.uuid4().hex}"
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not isinstance(content, dict) or content.get("action") != "ping":
            await self.send_json({"error": {"code": "unknown_action", "message": "send {\"action\": \"ping\"}"}})
            return
        ping_websocket.delay(self.group)

    async def probe_pong(self, event: dict[str, Any]) -> None:
        await self.send_json({"type": "pong", "source": event["source"]})
