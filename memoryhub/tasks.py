"""Infrastructure tasks: liveness round-trips through the broker and the channel layer."""

from __future__ import annotations

from asgiref.sync import async_to_sync
from celery import shared_task
from channels.layers import get_channel_layer


@shared_task(name="memoryhub.ping")
def ping() -> str:
    """Round-trips through broker, worker and result backend; used by operators and tests."""
    return "pong"


@shared_task(name="memoryhub.ping_websocket", acks_late=True, ignore_result=True)
def ping_websocket(group: str) -> None:
    """Send a pong from a worker to a websocket group, proving worker → channel layer → socket.

    The answer travels by the channel layer, so no result is kept (one fewer Redis write per ping);
    the consumer sends at most one at a time, with an expiry (memoryhub/consumers.py)."""
    async_to_sync(get_channel_layer().group_send)(group, {"type": "probe.pong", "source": "celery"})
