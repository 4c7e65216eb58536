"""Webhook test fixtures: a real HTTP receiver on 127.0.0.1, a clock that moves when told, and the
sender task run in-process (no broker), so back-off and 24-hour limits are tested in milliseconds."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.test import override_settings

from memories.models import ChangeEvent, Memory
from memories.services import memory_create, memory_forget
from stacks.models import Stack

# The browser fixtures (tests/e2e/browser.py) for test_browser.py.
from tests.e2e.browser import browser, dashboard_url, open_page  # noqa: F401
from webhooks import dispatch
from webhooks.models import WebhookEndpoint
from webhooks.services import endpoint_create


@pytest.fixture(autouse=True)
def _loopback_receivers() -> Iterator[None]:
    """The receivers below listen on 127.0.0.1 over plain http, which production refuses."""
    with override_settings(WEBHOOKS_ALLOW_LOOPBACK_HTTP=True):
        yield


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """An HTTP server on 127.0.0.1 that records every POST and answers with `codes` in turn (then 200).
    A slow receiver: the first `hold` requests get their answer only once `release` is set."""

    url: str
    requests: list[Received] = field(default_factory=list)
    codes: list[int] = field(default_factory=list)
    hold: int = 0
    release: threading.Event = field(default_factory=threading.Event)

    def bodies(self) -> list[dict[str, Any]]:
        import json

        return [json.loads(request.body) for request in self.requests]


def _serve(receiver_codes: list[int]) -> tuple[ThreadingHTTPServer, Receiver]:
    receiver = Receiver(url="", codes=receiver_codes)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with lock:
                receiver.requests.append(Received(headers=dict(self.headers.items()), body=body))
                code = receiver.codes.pop(0) if receiver.codes else 200
                held = len(receiver.requests) <= receiver.hold
            if held:
                receiver.release.wait(timeout=60)
            try:
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()
            except OSError:  # the sender is gone (a test killed it mid-request)
                pass

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server, receiver = _serve([])
    yield receiver
    server.shutdown()
    server.server_close()


@pytest.fixture
def second_receiver() -> Iterator[Receiver]:
    server, receiver = _serve([])
    yield receiver
    server.shutdown()
    server.server_close()


class Clock:
    """dispatch.clock: moves only when a test says so."""

    def __init__(self) -> None:
        self.now = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(dispatch, "clock", clock)
    return clock


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int | None, float]]:
    """What would have been sent to the broker: (endpoint pk, stack pk, countdown). Tests run the
    task themselves (`run`), at the moment they choose."""
    calls: list[tuple[int, int | None, float]] = []
    monkeypatch.setattr(dispatch, "enqueue",
                        lambda endpoint_id, stack_id, countdown=0: calls.append((endpoint_id, stack_id, countdown)))
    return calls


def change_event(stack: Stack, seq: int, *, topic: str = "memory", action: str = "create",
                 memory_ids: list[str] | None = None, source: str = "api") -> ChangeEvent:
    """A committed write's outbox row, as memories.changes.publish hands it to consumers (here made
    directly, so a test chooses seq and order; the real path is tested in test_events_path)."""
    return ChangeEvent.objects.create(stack=stack, seq=seq, topic=topic, action=action, source=source,
                                      memory_ids=memory_ids or [])


def make_endpoint(org: Any, url: str, *, types: list[str] | None = None, include_text: bool = False) -> tuple[
        WebhookEndpoint, str]:
    return endpoint_create(organization=org, url=url, event_types=types or ["*"], include_text=include_text)


def run(endpoint: WebhookEndpoint, stack: Stack | None) -> int:
    """The webhooks.deliver task, in-process: send this queue's due deliveries."""
    return dispatch.queue_run(endpoint.pk, stack.pk if stack else None)


def deliver_a_kept_and_a_forgotten_memory(school: Any, receiver: Receiver, second_receiver: Receiver) -> tuple[
        WebhookEndpoint, Memory, Memory]:
    """One change naming a kept and a forgotten memory, delivered to an endpoint that opted into
    text (`receiver`) and one that did not (`second_receiver`). Returns (the text endpoint, kept, gone)."""
    with_text, _ = make_endpoint(school.org, receiver.url, include_text=True)
    ids_only, _ = make_endpoint(school.org, second_receiver.url)
    kept = memory_create(stack=school.stack, kind="note", payload={"content": "Likes fractions"}, source="api")
    gone = memory_create(stack=school.stack, kind="note", payload={"content": "Old address"}, source="api")
    memory_forget(memory=gone, reason="parent asked")
    dispatch.fan_out(change_event(school.stack, 3, memory_ids=[str(kept.pk), str(gone.pk)]))
    run(with_text, school.stack)
    run(ids_only, school.stack)
    return with_text, kept, gone
