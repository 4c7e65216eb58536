"""A task round-trips through a real worker, and a worker's event reaches a real websocket; the
websocket is only for a signed-in session, sends at most one task at a time, and every websocket
has a message rate and size limit."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from celery.signals import before_task_publish
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.test import Client

from memoryhub.asgi import application
from memoryhub.limits import CLOSE_RATE_LIMITED, CLOSE_TOO_BIG
from memoryhub.tasks import ping
from tests.factories import make_org, make_user

ORIGIN = (b"origin", b"http://localhost")


def _signed_in_headers() -> list[tuple[bytes, bytes]]:
    """The headers of a browser signed in to the dashboard: its session cookie and origin."""
    browser = Client()
    browser.force_login(make_user(make_org()))
    cookie = f"{django_settings.SESSION_COOKIE_NAME}={browser.cookies[django_settings.SESSION_COOKIE_NAME].value}"
    return [ORIGIN, (b"cookie", cookie.encode())]


async def _probe(headers: list[tuple[bytes, bytes]]) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(application, "/ws/probe/", headers=headers)
    connected, _ = await communicator.connect()
    assert connected
    return communicator


@pytest.fixture
def published_pings() -> Iterator[list[str]]:
    """Every `memoryhub.ping_websocket` task this process hands to the broker (Celery's own signal)."""
    seen: list[str] = []
    lock = threading.Lock()

    def record(sender: Any = None, **kwargs: Any) -> None:
        if sender == "memoryhub.ping_websocket":
            with lock:
                seen.append(sender)

    before_task_publish.connect(record, weak=False)
    yield seen
    before_task_publish.disconnect(record)


@pytest.mark.django_db(transaction=True)
def test_celery_task_round_trips_through_a_real_worker(celery_worker: object) -> None:
    assert ping.delay().get(timeout=20) == "pong"


@pytest.mark.django_db(transaction=True)
@pytest.mark.anyio
async def test_websocket_receives_event_sent_from_a_celery_task(celery_worker: object) -> None:
    communicator = await _probe(await sync_to_async(_signed_in_headers)())
    for _ in range(2):  # the pong frees the connection's one ping slot for the next ping
        await communicator.send_json_to({"action": "ping"})
        message = await communicator.receive_json_from(timeout=20)
        assert message == {"type": "pong", "source": "celery"}
    await communicator.disconnect()


@pytest.mark.django_db(transaction=True)
@pytest.mark.anyio
async def test_probe_without_a_signed_in_session_is_refused() -> None:
    for headers in ([ORIGIN], [ORIGIN, (b"cookie", f"{django_settings.SESSION_COOKIE_NAME}=forged".encode())]):
        communicator = WebsocketCommunicator(application, "/ws/probe/", headers=headers)
        connected, _ = await communicator.connect()
        assert not connected


@pytest.mark.anyio
async def test_websocket_from_foreign_origin_is_refused() -> None:
    communicator = WebsocketCommunicator(application, "/ws/probe/", headers=[(b"origin", b"http://evil.example")])
    connected, _ = await communicator.connect()
    assert not connected


@pytest.mark.anyio
async def test_websocket_to_an_unknown_path_is_refused_cleanly() -> None:
    communicator = WebsocketCommunicator(application, "/ws/nothing-here/", headers=[ORIGIN])
    connected, code = await communicator.connect()
    assert not connected and code == 4404


@pytest.mark.django_db(transaction=True)
@pytest.mark.anyio
async def test_pings_faster_than_the_pongs_queue_one_task_at_a_time(published_pings: list[str],
                                                                    settings: Any) -> None:
    """300 pings used to queue 300 Celery tasks. Now a connection has one ping in flight; the others
    are answered `ping_pending` at once. The socket's channel layer here is channels' in-memory one,
    so no pong can come back and free the slot (a worker answers on the Redis layer): exactly one
    task, whatever the test session's worker is doing."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    communicator = await _probe(await sync_to_async(_signed_in_headers)())
    for _ in range(15):
        await communicator.send_json_to({"action": "ping"})
    replies = [await communicator.receive_json_from(timeout=5) for _ in range(14)]
    assert await communicator.receive_nothing(timeout=0.5)
    await communicator.disconnect()
    assert {r["error"]["code"] for r in replies} == {"ping_pending"}
    assert len(published_pings) == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.anyio
async def test_a_connection_over_the_message_rate_is_closed_with_4429(settings: Any) -> None:
    settings.WEBSOCKET_MESSAGE_BURST = 5
    settings.WEBSOCKET_MESSAGES_PER_SECOND = 0.01
    communicator = await _probe(await sync_to_async(_signed_in_headers)())
    for _ in range(5):
        await communicator.send_json_to({"action": "hello"})
        assert (await communicator.receive_json_from())["error"]["code"] == "unknown_action"
    await communicator.send_json_to({"action": "hello"})
    closed = await communicator.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": CLOSE_RATE_LIMITED, "reason": "message rate limit exceeded"}
    await communicator.wait(timeout=5)  # the consumer saw a disconnect and ended cleanly


@pytest.mark.django_db(transaction=True)
@pytest.mark.anyio
async def test_an_oversized_message_is_closed_with_1009() -> None:
    communicator = await _probe(await sync_to_async(_signed_in_headers)())
    await communicator.send_to(text_data="x" * (64 * 1024 + 1))
    closed = await communicator.receive_output(timeout=5)
    assert closed["type"] == "websocket.close" and closed["code"] == CLOSE_TOO_BIG
    await communicator.wait(timeout=5)


@pytest.mark.django_db(transaction=True)
@pytest.mark.anyio
async def test_binary_and_non_json_messages_get_an_answer_not_a_crash() -> None:
    communicator = await _probe(await sync_to_async(_signed_in_headers)())
    for frame in ({"text_data": "not json"}, {"bytes_data": b"\x00\x01"}):
        await communicator.send_to(**frame)
        assert (await communicator.receive_json_from())["error"]["code"] == "unknown_action"
    await communicator.disconnect()
