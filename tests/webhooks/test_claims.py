"""A delivery's claim is a short lease (webhooks/dispatch.py): a worker killed with SIGKILL mid-send leaves a
claim that frees itself within seconds, while a live sender waiting on a slow receiver renews its
lease and is never taken over — and a sender that lost its lease records nothing over the worker
that took the delivery on. The receivers are real HTTP servers on 127.0.0.1; the dead worker is a
real process killed with SIGKILL while its request is in flight."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from tests.actors import School
from tests.factories import database_url_for_processes
from tests.webhooks.conftest import Clock, Receiver, change_event, make_endpoint, run
from webhooks import dispatch
from webhooks.models import WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db(transaction=True)

BASE_DIR = Path(__file__).resolve().parents[2]
LEASE_BOUND = timedelta(seconds=20)  # "retaken within seconds": the lease must stay under this


def wait_for(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def delivery_of(endpoint: WebhookEndpoint) -> WebhookDelivery:
    return WebhookDelivery.objects.get(endpoint=endpoint)


@pytest.fixture
def fast_renewals(monkeypatch: pytest.MonkeyPatch) -> None:
    """Renew every 0.1 s, so a test sees renewals without waiting real seconds (the lease itself is
    measured on the test's clock)."""
    monkeypatch.setattr(dispatch, "RENEW_SECONDS", 0.1, raising=False)


@pytest.fixture
def sender_thread() -> Iterator[Callable[[WebhookEndpoint, School], threading.Thread]]:
    """Run the deliver task in a thread of its own (its own database connection), as a second
    worker would; its result lands in `thread.result`."""
    threads: list[threading.Thread] = []

    def start(endpoint: WebhookEndpoint, school: School) -> threading.Thread:
        def target() -> None:
            try:
                thread.result = run(endpoint, school.stack)  # type: ignore[attr-defined]
            finally:
                connection.close()

        thread = threading.Thread(target=target, daemon=True)
        thread.result = None  # type: ignore[attr-defined]
        thread.start()
        threads.append(thread)
        return thread

    yield start
    for thread in threads:
        thread.join(timeout=30)


_DEAD_WORKER = """
import django
django.setup()
from webhooks.dispatch import queue_run
queue_run({endpoint}, {stack})
"""


def test_a_killed_workers_delivery_is_retaken_after_its_short_lease_and_not_before(
        school: School, receiver: Receiver, clock: Clock, queued: list[Any]) -> None:
    endpoint, _ = make_endpoint(school.org, receiver.url)
    clock.now = timezone.now()  # the worker process reads the real clock: the delivery is due for it
    dispatch.fan_out(change_event(school.stack, 1, memory_ids=["m-1"]))
    receiver.hold = 1  # the first request is still waiting for its answer when the worker dies

    # A real worker process claims the delivery, sends it, and is killed with SIGKILL mid-request.
    worker = subprocess.Popen(
        [sys.executable, "-c", _DEAD_WORKER.format(endpoint=endpoint.pk, stack=school.stack.pk)],
        cwd=BASE_DIR, env=dict(os.environ, DATABASE_URL=database_url_for_processes(),
                               WEBHOOKS_ALLOW_LOOPBACK_HTTP="1"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        arrived = wait_for(lambda: len(receiver.requests) == 1 or worker.poll() is not None, timeout=60)
        assert arrived and worker.poll() is None, worker.communicate(timeout=5)[0].decode()[-3000:]
        # Measured from the request's arrival, not the process's start (which a busy machine can
        # make seconds long): the claim was taken just before the request was sent.
        sent = timezone.now()
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
        receiver.release.set()

    left = delivery_of(endpoint)
    assert left.status == "pending" and left.attempts == 0 and left.claimed_until is not None
    # The claim it left ends within seconds of when it was taken.
    assert left.claimed_until - sent <= LEASE_BOUND, left.claimed_until - sent

    # Before the lease ends: nobody sends it again, and the sweep leaves it alone.
    clock.now = left.claimed_until - timedelta(seconds=1)
    queued.clear()
    assert dispatch.sweep() == 0 and queued == []
    assert run(endpoint, school.stack) == 0
    assert len(receiver.requests) == 1

    # Just after: the sweep re-queues it at once (no grace for a lapsed lease) and it is delivered.
    clock.now = left.claimed_until + timedelta(seconds=1)
    assert dispatch.sweep() == 1 and queued == [(endpoint.pk, school.stack.pk, 0)]
    assert run(endpoint, school.stack) == 1
    assert len(receiver.requests) == 2
    assert receiver.requests[1].headers["MemoryHub-Event-Id"] == receiver.requests[0].headers["MemoryHub-Event-Id"]
    done = delivery_of(endpoint)
    assert (done.status, done.attempts, done.claimed_until) == ("delivered", 1, None)


@pytest.mark.usefixtures("fast_renewals")
def test_a_live_slow_delivery_renews_its_lease_and_is_not_taken_over(
        school: School, receiver: Receiver, clock: Clock, queued: list[Any],
        sender_thread: Callable[[WebhookEndpoint, School], threading.Thread]) -> None:
    endpoint, _ = make_endpoint(school.org, receiver.url)
    dispatch.fan_out(change_event(school.stack, 1, memory_ids=["m-1"]))
    receiver.hold = 1
    first = sender_thread(endpoint, school)  # worker A: its receiver takes its time
    assert wait_for(lambda: len(receiver.requests) == 1, timeout=20)
    taken = delivery_of(endpoint).claimed_until
    assert taken is not None

    # Well past the lease A first took: A is still waiting, and renews.
    clock.advance(seconds=90)
    assert wait_for(lambda: (until := delivery_of(endpoint).claimed_until) is not None and until > clock.now,
                    timeout=10), "the sender did not renew its lease"

    # Worker B and the sweep find it held: nothing is sent twice.
    queued.clear()
    assert dispatch.sweep() == 0
    assert run(endpoint, school.stack) == 0
    assert len(receiver.requests) == 1

    receiver.release.set()
    first.join(timeout=20)
    assert first.result == 1  # type: ignore[attr-defined]
    done = delivery_of(endpoint)
    assert (done.status, done.attempts, done.claimed_until) == ("delivered", 1, None)
    assert len(receiver.requests) == 1


def test_a_sender_that_lost_its_lease_records_nothing_over_the_new_holder(
        school: School, receiver: Receiver, clock: Clock, queued: list[Any], monkeypatch: pytest.MonkeyPatch,
        sender_thread: Callable[[WebhookEndpoint, School], threading.Thread]) -> None:
    endpoint, _ = make_endpoint(school.org, receiver.url)
    dispatch.fan_out(change_event(school.stack, 1, memory_ids=["m-1"]))
    monkeypatch.setattr(dispatch, "RENEW_SECONDS", 3600.0, raising=False)  # A stalls: it does not renew in this test
    receiver.hold = 1
    receiver.codes = [500]  # A's attempt fails, B's succeeds
    queued.clear()
    stalled = sender_thread(endpoint, school)
    assert wait_for(lambda: len(receiver.requests) == 1, timeout=20)

    clock.advance(seconds=90)  # A's lease lapsed: B takes the delivery over and delivers it
    assert run(endpoint, school.stack) == 1
    assert len(receiver.requests) == 2

    receiver.release.set()  # A's late failure must not undo B's delivery
    stalled.join(timeout=20)
    assert stalled.result == 0  # type: ignore[attr-defined]
    done = delivery_of(endpoint)
    assert (done.status, done.attempts, done.last_status_code, done.claimed_until) == ("delivered", 1, 200, None)
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).last_attempt_ok is True
    assert queued == []  # and A queued no retry of a delivery it no longer holds


def test_the_sweep_leaves_a_fresh_unclaimed_delivery_to_its_queued_task(
        school: School, receiver: Receiver, clock: Clock, queued: list[Any]) -> None:
    endpoint, _ = make_endpoint(school.org, receiver.url)
    dispatch.fan_out(change_event(school.stack, 1))
    queued.clear()
    assert dispatch.sweep() == 0  # its after-commit task is most likely still in the broker's queue
    clock.now += dispatch.SWEEP_GRACE
    assert dispatch.sweep() == 1  # that task was lost: queue another
    assert queued == [(endpoint.pk, school.stack.pk, 0)]
