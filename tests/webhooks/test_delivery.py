"""Webhook deliveries end to end against a real HTTP receiver on 127.0.0.1: signed as docs/webhooks.md
documents, retried with back-off, in order per stack, never across schools, text only when asked."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from django.core import mail
from django.db import connection

from accounts.models import AuditEvent
from memories.changes.feed import event_dict
from memories.services import memory_create
from tests.actors import School
from tests.webhooks.conftest import (
    Clock,
    Receiver,
    change_event,
    deliver_a_kept_and_a_forgotten_memory,
    make_endpoint,
    run,
)
from webhooks import dispatch
from webhooks.models import WebhookDelivery, WebhookEndpoint
from webhooks.sealing import unseal

WEBHOOKS_DOC = Path(__file__).resolve().parents[2] / "docs" / "webhooks.md"


def readme_verify() -> Any:
    """The `verify` function of docs/webhooks.md, executed from the page's text."""
    section = WEBHOOKS_DOC.read_text().split("## Verifying the signature", 1)[1].split("\n## ", 1)[0]
    snippet = re.search(r"```python\n(.*?)```", section, re.S)
    assert snippet is not None, "docs/webhooks.md has no Python snippet under 'Verifying the signature'"
    namespace: dict[str, Any] = {}
    exec(compile(snippet.group(1), "docs/webhooks.md", "exec"), namespace)  # noqa: S102 - our own docs
    return namespace["verify"]


def test_signature_verifies_with_the_readme_snippet(school: School, receiver: Receiver, clock: Clock,
                                                    queued: list[Any]) -> None:
    endpoint, secret = make_endpoint(school.org, receiver.url)
    event = change_event(school.stack, 1, memory_ids=["m-1"])
    assert dispatch.fan_out(event) == 1
    assert run(endpoint, school.stack) == 1

    [request] = receiver.requests
    verify = readme_verify()
    header = request.headers["MemoryHub-Signature"]
    assert re.fullmatch(r"t=\d+,v1=[0-9a-f]{64}", header)
    assert verify(secret, header, request.body)
    assert not verify(secret, header, request.body.replace(b"m-1", b"m-2"))  # a changed body fails
    assert not verify("whsec_wrong", header, request.body)
    assert request.headers["MemoryHub-Event-Id"] == str(event.pk)
    assert request.headers["MemoryHub-Delivery-Attempt"] == "1"
    body = json.loads(request.body)
    assert body["type"] == "memory.created"
    assert body["school"] == school.org.public_id
    assert body["data"] == {"id": event.pk, "stack": "alice", "seq": 1, "topic": "memory", "action": "create",
                            "source": "api", "memory_ids": ["m-1"], "at": event_dict(event, "alice")["at"]}
    assert "memories" not in body
    assert WebhookDelivery.objects.get(public_id=body["id"]).status == "delivered"


def test_a_receiver_failing_twice_gets_the_event_three_times_with_back_off(
        school: School, receiver: Receiver, clock: Clock, queued: list[Any]) -> None:
    receiver.codes = [500, 503]
    endpoint, _ = make_endpoint(school.org, receiver.url)
    event = change_event(school.stack, 7)
    dispatch.fan_out(event)

    run(endpoint, school.stack)
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("pending", 1, 500)
    assert delivery.next_attempt_at == clock.now + dispatch.retry_delay(1)
    run(endpoint, school.stack)  # not due yet: nothing is sent
    assert len(receiver.requests) == 1

    clock.advance(seconds=10)
    run(endpoint, school.stack)
    clock.advance(seconds=30)
    run(endpoint, school.stack)

    assert [r.headers["MemoryHub-Delivery-Attempt"] for r in receiver.requests] == ["1", "2", "3"]
    assert {r.headers["MemoryHub-Event-Id"] for r in receiver.requests} == {str(event.pk)}
    assert len({json.loads(r.body)["id"] for r in receiver.requests}) == 1  # same delivery id each time
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == ("delivered", 3, 200)
    # The retries were queued with the back-off as their countdown: 10 s, then 30 s.
    assert [countdown for _, _, countdown in queued] == [10, 30]
    endpoint.refresh_from_db()
    assert endpoint.failing_since is None and endpoint.last_attempt_ok


def test_back_off_grows_and_is_capped() -> None:
    delays = [dispatch.retry_delay(n).total_seconds() for n in range(1, 9)]
    assert delays[:4] == [10, 30, 90, 270]
    assert max(delays) == 3600 and delays == sorted(delays)


def test_order_per_stack_holds_while_the_first_event_fails(
        school: School, receiver: Receiver, clock: Clock, queued: list[Any]) -> None:
    receiver.codes = [500]
    endpoint, _ = make_endpoint(school.org, receiver.url)
    first, second = change_event(school.stack, 10), change_event(school.stack, 11)
    elsewhere = change_event(school.other_stack, 12)
    for event in (second, first, elsewhere):  # recorded out of order: seq decides
        dispatch.fan_out(event)

    run(endpoint, school.stack)
    assert [b["data"]["seq"] for b in receiver.bodies()] == [10]  # 11 waits behind the failing 10
    run(endpoint, school.other_stack)  # another stack is not held up
    assert [b["data"]["seq"] for b in receiver.bodies()] == [10, 12]

    clock.advance(seconds=10)
    run(endpoint, school.stack)
    assert [b["data"]["seq"] for b in receiver.bodies()] == [10, 12, 10, 11]
    assert set(WebhookDelivery.objects.values_list("status", flat=True)) == {"delivered"}


def test_a_delivery_given_up_after_24_hours_lets_the_next_one_go(
        school: School, receiver: Receiver, second_receiver: Receiver, clock: Clock, queued: list[Any]) -> None:
    endpoint, _ = make_endpoint(school.org, receiver.url)
    dispatch.fan_out(change_event(school.stack, 1))
    dispatch.fan_out(change_event(school.stack, 2))
    receiver.codes = [500] * 1000
    run(endpoint, school.stack)
    # A success elsewhere keeps the endpoint from being disabled: only the delivery is given up.
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(failing_since=None)
    clock.advance(hours=24)
    receiver.codes = [500]
    run(endpoint, school.stack)
    statuses = dict(WebhookDelivery.objects.values_list("seq", "status"))
    assert statuses == {1: "failed", 2: "delivered"}


def test_an_endpoint_failing_for_24_hours_is_disabled_audited_and_the_admins_told(
        school: School, receiver: Receiver, clock: Clock, queued: list[Any], client: Any) -> None:
    receiver.codes = [500] * 1000
    endpoint, _ = make_endpoint(school.org, receiver.url)
    dispatch.fan_out(change_event(school.stack, 1))
    started = clock.now
    for _ in range(100):
        run(endpoint, school.stack)
        endpoint.refresh_from_db()
        if not endpoint.enabled:
            break
        clock.now = WebhookDelivery.objects.get(endpoint=endpoint).next_attempt_at
    assert not endpoint.enabled and endpoint.disabled_reason == "failing"
    assert clock.now - started >= dispatch.RETRY_WINDOW
    attempts = WebhookDelivery.objects.get(endpoint=endpoint).attempts
    assert len(receiver.requests) == attempts and 20 < attempts < 40  # back-off, not hammering

    audit = AuditEvent.objects.get(organization=school.org, action="webhook.disabled")
    assert audit.metadata["reason"] == "failing" and audit.target_id == endpoint.public_id
    [message] = mail.outbox
    assert message.to == [school.admin.email] and endpoint.url.split("?")[0] in message.body
    # A new event is not even recorded for a disabled endpoint, and nothing more is sent.
    assert dispatch.fan_out(change_event(school.stack, 2)) == 0
    clock.advance(hours=1)
    run(endpoint, school.stack)
    assert len(receiver.requests) == attempts

    client.force_login(school.admin)
    page = client.get("/dashboard/webhooks/").content.decode()
    assert "Needs attention" in page and endpoint.url in page


def test_a_receiver_of_school_a_never_receives_school_b_events(
        school: School, other_school: School, receiver: Receiver, second_receiver: Receiver, clock: Clock,
        queued: list[Any]) -> None:
    mine, _ = make_endpoint(school.org, receiver.url, include_text=True)
    theirs, _ = make_endpoint(other_school.org, second_receiver.url, include_text=True)
    memory = memory_create(stack=other_school.stack, kind="note", payload={"content": "Carol's secret plan"},
                           source="api")

    assert dispatch.fan_out(change_event(other_school.stack, 5, memory_ids=[str(memory.pk)])) == 1
    # Even a (corrupt) event listing school B's memory on school A's stack gives A nothing of B.
    dispatch.fan_out(change_event(school.stack, 6, memory_ids=[str(memory.pk)]))
    for endpoint in (mine, theirs):
        for stack in (school.stack, school.other_stack, other_school.stack, other_school.other_stack):
            run(endpoint, stack)

    assert [b["school"] for b in second_receiver.bodies()] == [other_school.org.public_id]
    assert second_receiver.bodies()[0]["memories"][0]["text"] == "Carol's secret plan"
    [leak_check] = receiver.bodies()
    assert leak_check["school"] == school.org.public_id and leak_check["data"]["stack"] == "alice"
    assert "Carol" not in receiver.requests[0].body.decode()
    # Not even the id: the endpoint's grants are checked against this stack's rows only (memories.privacy.grants).
    assert leak_check["memories"] == [] and leak_check["data"]["memory_ids"] == []


def test_memory_text_only_when_the_endpoint_opted_in(
        school: School, receiver: Receiver, second_receiver: Receiver, clock: Clock, queued: list[Any]) -> None:
    _with_text, kept, gone = deliver_a_kept_and_a_forgotten_memory(school, receiver, second_receiver)

    [body] = receiver.bodies()
    assert body["memories"] == [{"id": str(kept.pk), "kind": "note", "text": "Likes fractions"},
                                {"id": str(gone.pk), "kind": "note"}]  # a forgotten memory goes without text
    [bare] = second_receiver.bodies()
    assert "memories" not in bare and b"fractions" not in second_receiver.requests[0].body


def test_subscriptions_filter_event_types(school: School, receiver: Receiver, clock: Clock,
                                          queued: list[Any]) -> None:
    endpoint, _ = make_endpoint(school.org, receiver.url, types=["memory.forgotten", "checkpoint.saved"])
    assert dispatch.fan_out(change_event(school.stack, 1, action="create")) == 0
    assert dispatch.fan_out(change_event(school.stack, 2, action="forget")) == 1
    assert dispatch.fan_out(change_event(school.stack, 3, topic="checkpoint", action="save")) == 1
    run(endpoint, school.stack)
    assert [b["type"] for b in receiver.bodies()] == ["memory.forgotten", "checkpoint.saved"]


def test_the_fan_out_is_idempotent(school: School, receiver: Receiver, clock: Clock, queued: list[Any]) -> None:
    endpoint, _ = make_endpoint(school.org, receiver.url)
    event = change_event(school.stack, 1)
    dispatch.fan_out(event)
    dispatch.fan_out(event)  # the relay publishing the same event again
    assert WebhookDelivery.objects.filter(endpoint=endpoint).count() == 1


def test_the_secret_is_not_stored_in_clear(school: School, receiver: Receiver) -> None:
    endpoint, secret = make_endpoint(school.org, receiver.url)
    assert secret.startswith("whsec_") and len(secret) > 40
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM webhooks_webhookendpoint WHERE id = %s", [endpoint.pk])
        row = cursor.fetchone()
    assert row is not None and not any(secret in str(value) for value in row)
    assert not any(secret[6:20] in str(value) for value in row)
    assert unseal(endpoint.secret_sealed) == secret  # readable by us, with SECRET_KEY
    audit = AuditEvent.objects.get(action="webhook.created", target_id=endpoint.public_id)
    assert secret not in json.dumps(audit.metadata)


def test_sweep_requeues_due_deliveries(school: School, receiver: Receiver, clock: Clock,
                                       queued: list[Any]) -> None:
    endpoint, _ = make_endpoint(school.org, receiver.url)
    dispatch.fan_out(change_event(school.stack, 1))
    queued.clear()
    clock.now += dispatch.SWEEP_GRACE  # its task was lost (a fresh one is left to its task: test_claims)
    assert dispatch.sweep() == 1
    assert queued == [(endpoint.pk, school.stack.pk, 0)]


@pytest.mark.parametrize("url", [
    "https://10.0.0.1/hook", "https://169.254.169.254/latest/meta-data", "https://192.168.1.5/",
    "https://[fd00::1]/", "https://[::ffff:10.0.0.1]/", "http://example.org/hook", "ftp://127.0.0.1/",
    "https://user:pass@127.0.0.1/", "not a url",
])
def test_private_and_plain_http_targets_are_refused(url: str) -> None:
    from webhooks.targets import TargetRefused, target_checked

    with pytest.raises(TargetRefused):
        target_checked(url)


def test_loopback_only_when_allowed(settings: Any) -> None:
    from webhooks.targets import TargetRefused, target_checked

    assert target_checked("http://127.0.0.1:9/hook").address == "127.0.0.1"
    settings.WEBHOOKS_ALLOW_LOOPBACK_HTTP = False
    settings.DEBUG = False
    for url in ("http://127.0.0.1:9/hook", "https://127.0.0.1/hook", "https://localhost/hook"):
        with pytest.raises(TargetRefused):
            target_checked(url)


def test_the_delivery_log_keeps_30_days_of_finished_deliveries(school: School, receiver: Receiver, clock: Clock,
                                                               queued: list[Any]) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from webhooks.services import deliveries_prune

    endpoint, _ = make_endpoint(school.org, receiver.url)
    for seq in (1, 2, 3):
        dispatch.fan_out(change_event(school.stack, seq, memory_ids=[f"m-{seq}"]))
    now = timezone.now()
    old, recent, pending = WebhookDelivery.objects.filter(endpoint=endpoint).order_by("seq")
    WebhookDelivery.objects.filter(pk=old.pk).update(status="delivered", finished_at=now - timedelta(days=31))
    WebhookDelivery.objects.filter(pk=recent.pk).update(status="failed", finished_at=now - timedelta(days=29))
    WebhookDelivery.objects.filter(pk=pending.pk).update(created_at=now - timedelta(days=40))

    assert deliveries_prune(now=now) == 1
    assert set(WebhookDelivery.objects.values_list("pk", flat=True)) == {recent.pk, pending.pk}
