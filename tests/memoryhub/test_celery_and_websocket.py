"""A task round-trips through a real worker, and a worker's event reaches a real websocket."""

from __future__ import annotations

import pytest
from channels.testing import WebsocketCommunicator

from memoryhub.asgi import application
from memoryhub.tasks import ping


@pytest.mark.django_db(transaction=True)
def test_celery_task_round_trips_through_a_real_worker(celery_worker: object) -> None:
    assert ping.delay().get(timeout=20) == "pong"


@pytest.mark.django_db(transaction=True)
@pytest.mark.anyio
async def test_websocket_receives_event_sent_from_a_celery_task(celery_worker: object) -> None:
    communicator = WebsocketCommunicator(application, "/ws/probe/", headers=[(b"origin", b"http://localhost")])
    connected, _ = await communicator.connect()
    assert connected
    await communicator.send_json_to({"action": "ping"})
    message = await communicator.receive_json_from(timeout=20)
    assert message == {"type": "pong", "source": "celery"}
    await communicator.disconnect()


@pytest.mark.anyio
async def test_websocket_from_foreign_origin_is_refused() -> None:
    communicator = WebsocketCommunicator(application, "/ws/probe/", headers=[(b"origin", b"http://evil.example")])
    connected, _ = await communicator.connect()
    assert not connected
