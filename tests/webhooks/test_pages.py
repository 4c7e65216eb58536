"""The Webhooks dashboard pages: admins register, switch, rotate, test and delete endpoints and read
their delivery logs; every change is audited; nobody else (and no other school) reaches any of it."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from accounts.models import AuditEvent, Membership
from tests.actors import School
from tests.factories import make_user
from tests.webhooks.conftest import Clock, Receiver, change_event, make_endpoint, run
from webhooks import dispatch
from webhooks.models import WebhookDelivery, WebhookEndpoint
from webhooks.sealing import unseal

LIST = reverse("dashboard:webhooks")


def client_for(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def audited(school: School, action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(organization=school.org, action=action))


def test_admin_adds_an_endpoint_and_sees_the_secret_once(school: School, receiver: Receiver) -> None:
    client = client_for(school.admin)
    response = client.post(LIST, {"url": receiver.url, "description": "SIS sync",
                                  "event_types": ["memory.created", "memory.forgotten"], "include_text": "on"})
    assert response.status_code == 201
    assert "no-store" in response["Cache-Control"]
    endpoint = WebhookEndpoint.objects.get(organization=school.org)
    assert endpoint.event_types == ["memory.created", "memory.forgotten"] and endpoint.include_text
    page = response.content.decode()
    secret = page.split('id="webhook-secret">', 1)[1].split("<", 1)[0]
    assert unseal(endpoint.secret_sealed) == secret
    assert 'data-copy="#webhook-secret"' in page
    assert secret not in client.get(LIST).content.decode()  # shown once
    [event] = audited(school, "webhook.created")
    assert event.actor == school.admin and event.target_id == endpoint.public_id and secret not in str(event.metadata)


@pytest.mark.parametrize("form", [
    {"url": "https://10.1.2.3/hook", "event_types": ["*"]},
    {"url": "http://example.org/hook", "event_types": ["*"]},
    {"url": "not a url", "event_types": ["*"]},
    {"url": "https://127.0.0.1/hook", "event_types": []},
    {"url": "https://127.0.0.1/hook", "event_types": ["memory.exploded"]},
])
def test_bad_input_is_400_and_stores_nothing(school: School, form: dict[str, Any]) -> None:
    response = client_for(school.admin).post(LIST, form)
    assert response.status_code == 400
    assert "errorlist" in response.content.decode()
    assert not WebhookEndpoint.objects.exists() and not audited(school, "webhook.created")


def test_disable_enable_rotate_and_delete_are_audited(school: School, receiver: Receiver) -> None:
    endpoint, secret = make_endpoint(school.org, receiver.url)
    client = client_for(school.admin)
    ident = endpoint.public_id

    assert client.post(reverse("dashboard:webhook-disable", args=[ident])).status_code == 302
    endpoint.refresh_from_db()
    assert not endpoint.enabled and endpoint.disabled_reason == "admin"
    assert client.post(reverse("dashboard:webhook-enable", args=[ident])).status_code == 302
    endpoint.refresh_from_db()
    assert endpoint.enabled

    response = client.post(reverse("dashboard:webhook-rotate", args=[ident]))
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    new_secret = response.content.decode().split('id="webhook-secret">', 1)[1].split("<", 1)[0]
    endpoint.refresh_from_db()
    assert new_secret != secret and unseal(endpoint.secret_sealed) == new_secret

    assert client.post(reverse("dashboard:webhook-delete", args=[ident])).status_code == 302
    assert not WebhookEndpoint.objects.exists()
    for action in ("webhook.disabled", "webhook.enabled", "webhook.secret_rotated", "webhook.deleted"):
        assert [e.target_id for e in audited(school, action)] == [ident], action


def test_send_test_event_reaches_the_receiver_and_shows_in_the_log(
        school: School, receiver: Receiver, clock: Clock, queued: list[Any]) -> None:
    endpoint, _ = make_endpoint(school.org, receiver.url, types=["memory.created"])
    client = client_for(school.admin)
    response = client.post(reverse("dashboard:webhook-test", args=[endpoint.public_id]))
    assert response.status_code == 302
    run(endpoint, None)
    [body] = receiver.bodies()
    assert body["type"] == "webhook.test" and body["school"] == school.org.public_id
    assert audited(school, "webhook.test_sent")
    log = client.get(reverse("dashboard:webhook", args=[endpoint.public_id]))
    assert log.status_code == 200
    assert "webhook.test" in log.content.decode() and 'data-status="delivered"' in log.content.decode()


def test_the_log_shows_attempts_and_filters_by_status(
        school: School, receiver: Receiver, clock: Clock, queued: list[Any]) -> None:
    receiver.codes = [500, 500]
    endpoint, _ = make_endpoint(school.org, receiver.url)
    dispatch.fan_out(change_event(school.stack, 1))
    dispatch.fan_out(change_event(school.other_stack, 2))
    run(endpoint, school.stack)  # 500
    run(endpoint, school.other_stack)  # 500
    client = client_for(school.admin)
    assert '<span class="badge warn">failing</span>' in client.get(LIST).content.decode()
    clock.advance(seconds=10)
    run(endpoint, school.stack)  # 200: the endpoint works again (bob's delivery still waits for its retry)
    url = reverse("dashboard:webhook", args=[endpoint.public_id])

    delivered = client.get(url, {"status": "delivered"}).content.decode()
    assert delivered.count("data-delivery=") == 1 and "alice" in delivered
    pending = client.get(url, {"status": "pending"}).content.decode()
    assert pending.count("data-delivery=") == 1 and "bob" in pending and ">500<" in pending
    assert client.get(url, {"status": "exploded"}).status_code == 400
    assert '<span class="badge ok">active</span>' in client.get(LIST).content.decode()


def test_the_log_is_paginated(school: School, receiver: Receiver, clock: Clock, queued: list[Any]) -> None:
    endpoint, _ = make_endpoint(school.org, receiver.url)
    for seq in range(1, 56):
        dispatch.fan_out(change_event(school.stack, seq))
    client = client_for(school.admin)
    url = reverse("dashboard:webhook", args=[endpoint.public_id])
    first = client.get(url).content.decode()
    assert first.count("data-delivery=") == 50 and "Page 1 of 2" in first
    assert client.get(url, {"page": 2}).content.decode().count("data-delivery=") == 5


def _pages(endpoint_id: str) -> list[tuple[str, str]]:
    return [("get", LIST), ("post", LIST), ("get", reverse("dashboard:webhook", args=[endpoint_id]))] + [
        ("post", reverse(f"dashboard:webhook-{action}", args=[endpoint_id]))
        for action in ("disable", "enable", "delete", "rotate", "test")]


def test_another_schools_endpoint_is_404_on_every_page(school: School, other_school: School,
                                                       receiver: Receiver) -> None:
    theirs, secret = make_endpoint(other_school.org, receiver.url)
    client = client_for(school.admin)
    for method, url in _pages(theirs.public_id)[2:]:
        assert getattr(client, method)(url).status_code == 404, url
    assert client.get(LIST).content.decode().count(theirs.public_id) == 0
    theirs.refresh_from_db()
    assert theirs.enabled and unseal(theirs.secret_sealed) == secret  # untouched
    assert not WebhookDelivery.objects.exists()
    assert client.get(reverse("dashboard:webhook", args=["whk_nonexistent"])).status_code == 404


@pytest.mark.parametrize("role", [Membership.Role.TEACHER, Membership.Role.BILLING])
def test_teachers_and_billing_users_get_404_everywhere(school: School, receiver: Receiver, role: str) -> None:
    endpoint, _ = make_endpoint(school.org, receiver.url)
    client = client_for(make_user(school.org, role=role))
    for method, url in _pages(endpoint.public_id):
        assert getattr(client, method)(url).status_code == 404, (role, url)
    assert WebhookEndpoint.objects.get().enabled
    assert "Webhooks" not in client_for(school.teacher).get(reverse("dashboard:overview")).content.decode()


def test_signed_out_is_sent_to_login(receiver: Receiver) -> None:
    assert Client().get(LIST).status_code == 302


def test_admins_see_the_nav_entry(school: School) -> None:
    page = client_for(school.admin).get(reverse("dashboard:overview")).content.decode()
    assert f'href="{LIST}"' in page
