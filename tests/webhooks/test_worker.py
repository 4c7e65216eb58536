"""Webhooks end to end on the real parts: agents write through the API, the change event's
fan-out records deliveries, and the suite's real Celery worker (on the real Redis broker) sends
them — retrying a failing receiver with the real countdown — in order, signed."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from memories.changes import publish
from tests.actors import School
from tests.webhooks.conftest import Receiver, make_endpoint
from tests.webhooks.test_delivery import readme_verify
from webhooks.models import WebhookDelivery

pytestmark = pytest.mark.django_db(transaction=True)


def wait_for(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def note(school: School, text: str) -> str:
    response = school.agent.post(school.stack_url("memories"), {"kind": "note", "content": text}, format="json")
    assert response.status_code == 201, response.content
    return str(response.json()["id"])


def test_the_worker_delivers_in_order_and_retries_a_failing_receiver(
        school: School, receiver: Receiver, celery_worker: Any) -> None:
    endpoint, secret = make_endpoint(school.org, receiver.url, types=["memory.created"])
    receiver.codes = [503]  # the first attempt fails; the retry comes after the back-off (10 s)
    ids = [note(school, f"Practised fractions, day {n}") for n in range(3)]
    assert publish.wait_published()

    assert wait_for(lambda: len(receiver.requests) >= 4, timeout=40), receiver.requests
    bodies = receiver.bodies()
    delivered = [body["data"]["memory_ids"] for body in bodies]
    assert delivered == [[ids[0]], [ids[0]], [ids[1]], [ids[2]]]  # the failed one again, then the rest in order
    for request in receiver.requests:
        assert readme_verify()(secret, request.headers["MemoryHub-Signature"], request.body)
    logged = WebhookDelivery.objects.filter(endpoint=endpoint).order_by("seq")
    assert wait_for(lambda: all(d.status == "delivered" for d in logged.all()), timeout=5)
    assert [d.attempts for d in logged] == [2, 1, 1]


def test_the_worker_never_sends_one_schools_events_to_anothers_receiver(
        school: School, other_school: School, receiver: Receiver, celery_worker: Any) -> None:
    make_endpoint(school.org, receiver.url)
    note(other_school, f"Other school's note {uuid.uuid4()}")
    mine = note(school, "Our note")
    assert publish.wait_published()
    assert wait_for(lambda: any(b["data"].get("memory_ids") == [mine] for b in receiver.bodies()), timeout=20)
    time.sleep(0.5)
    assert {body["data"]["stack"] for body in receiver.bodies()} == {school.stack.slug}
