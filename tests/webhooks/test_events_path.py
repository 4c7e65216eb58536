"""The webhooks fan-out is a consumer of the real change-event path: a committed write records a
delivery and queues the sender after commit; a rolled-back write records nothing."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

from memories.services import memory_create
from tests.actors import School
from tests.webhooks.conftest import Clock, Receiver, make_endpoint, run
from webhooks.models import WebhookDelivery


def test_a_committed_write_reaches_the_receiver(school: School, receiver: Receiver, clock: Clock,
                                                queued: list[Any], django_capture_on_commit_callbacks: Any) -> None:
    endpoint, _ = make_endpoint(school.org, receiver.url, types=["memory.created"])
    with django_capture_on_commit_callbacks(execute=True):
        memory = memory_create(stack=school.stack, kind="note", payload={"content": "Reads at home"}, source="api")
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.event_type == "memory.created" and delivery.data["memory_ids"] == [str(memory.pk)]
    assert (endpoint.pk, school.stack.pk, 0) in queued  # the sender task, queued after commit
    run(endpoint, school.stack)
    [body] = receiver.bodies()
    assert body["data"]["stack"] == "alice" and body["data"]["seq"] == delivery.seq


def test_a_rolled_back_write_records_no_delivery(school: School, receiver: Receiver, queued: list[Any],
                                                 django_capture_on_commit_callbacks: Any) -> None:
    make_endpoint(school.org, receiver.url)
    with django_capture_on_commit_callbacks(execute=True), pytest.raises(RuntimeError), transaction.atomic():
        memory_create(stack=school.stack, kind="note", payload={"content": "never"}, source="api")
        raise RuntimeError("the write fails after its insert")
    assert not WebhookDelivery.objects.exists() and not queued


def test_erasing_a_student_deletes_the_deliveries_about_them_and_announces_the_erasure(
        school: School, receiver: Receiver, clock: Clock, queued: list[Any],
        django_capture_on_commit_callbacks: Any) -> None:
    from memories.changes import publish

    make_endpoint(school.org, receiver.url)
    with django_capture_on_commit_callbacks(execute=True):
        memory_create(stack=school.stack, kind="note", payload={"content": "Worried about the move"}, source="api")
        memory_create(stack=school.other_stack, kind="note", payload={"content": "Bob's note"}, source="api")
    assert publish.wait_published()
    assert WebhookDelivery.objects.filter(stack=school.stack).count() == 1  # pending: the receiver was not called

    with django_capture_on_commit_callbacks(execute=True):
        response = school.admin_api.post(school.stack_url("erase"), {"requested_by": "a parent", "confirm": "alice"},
                                         format="json")
    assert response.status_code == 200, response.content
    assert response.json()["counts"]["webhook_deliveries"] == 1
    assert publish.wait_published()
    # What is left about the student is the erasure's own notice: memory ids only, no text.
    left = list(WebhookDelivery.objects.filter(stack=school.stack).values_list("event_type", "data"))
    assert {(event_type, data["action"]) for event_type, data in left} == {("memory.deleted", "erase")}
    assert "Worried" not in str(left)
    assert WebhookDelivery.objects.filter(stack=school.other_stack).count() == 1  # another student's: untouched
