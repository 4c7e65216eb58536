"""Webhook targets and IPv6 forms that carry an IPv4 address: NAT64, 6to4, Teredo, IPv4-compatible,
-mapped and -translated addresses reach the IPv4 address inside them, so 169.254.169.254 (the cloud
metadata service) or 10.0.0.1 must not get through dressed as IPv6 — neither when an admin saves
the endpoint nor when a name that resolved to a public address at registration resolves to such an
address at delivery time (DNS rebinding). Names are resolved by a stand-in for getaddrinfo, so
the test decides what each name resolves to."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from accounts.models import AuditEvent
from tests.actors import School
from tests.webhooks.conftest import Clock, change_event, make_endpoint, run
from webhooks import dispatch
from webhooks.models import WebhookDelivery, WebhookEndpoint
from webhooks.targets import TargetRefused, target_checked

# Each form, with the IPv4 address it carries where that is a private, link-local or loopback one.
EMBEDDING_FORMS = {
    "64:ff9b::a9fe:a9fe": "NAT64 (RFC 6052) of 169.254.169.254",
    "64:ff9b::a00:1": "NAT64 of 10.0.0.1",
    "64:ff9b::7f00:1": "NAT64 of 127.0.0.1",
    "64:ff9b:1::a9fe:a9fe": "local-use NAT64 (RFC 8215)",
    "64:ff9b:1:a9fe:a9fe::": "local-use NAT64, IPv4 in bits 48-80",
    "2002:a9fe:a9fe::1": "6to4 of 169.254.169.254",
    "2002:808:808::1": "6to4, even of a public address",
    "::a9fe:a9fe": "IPv4-compatible 169.254.169.254",
    "::808:808": "IPv4-compatible, even of a public address",
    "::ffff:a9fe:a9fe": "IPv4-mapped 169.254.169.254",
    "::ffff:0:a9fe:a9fe": "IPv4-translated (SIIT) 169.254.169.254",
    "2001:0:4136:e378:8000:63bf:5601:5601": "Teredo, client 169.254.169.254",
    "fec0::1": "site-local",
    "3fff::1": "documentation (RFC 9637)",
}
HOST = "hooks.receiver.example"


@pytest.fixture
def dns(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """What HOST resolves to (every other name resolves as usual); a test changes it at will."""
    answers: dict[str, str] = {}
    real: Callable[..., Any] = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host not in answers:
            return real(host, port, *args, **kwargs)
        address = answers[host]
        if ":" in address:
            return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, port, 0, 0))]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return answers


@pytest.mark.parametrize("address", list(EMBEDDING_FORMS))
def test_ipv6_forms_that_embed_an_ipv4_address_are_refused(address: str, dns: dict[str, str]) -> None:
    with pytest.raises(TargetRefused, match="webhooks only go to public addresses"):
        target_checked(f"https://[{address}]/hook")
    dns[HOST] = address
    with pytest.raises(TargetRefused, match="private, loopback or reserved"):
        target_checked(f"https://{HOST}/hook")


def test_the_refusal_names_the_ipv4_address_inside() -> None:
    with pytest.raises(TargetRefused, match=r"64:ff9b::a9fe:a9fe, which carries 169\.254\.169\.254"):
        target_checked("https://[64:ff9b::a9fe:a9fe]/latest/meta-data")
    with pytest.raises(TargetRefused, match="6to4"):
        target_checked("https://[2002:a9fe:a9fe::1]/")


@pytest.mark.parametrize("address", ["2606:4700:4700::1111", "64:ff9b::808:808", "::ffff:808:808", "8.8.8.8"])
def test_public_addresses_stay_allowed(address: str, dns: dict[str, str]) -> None:
    """A public IPv6 address, and the NAT64 (DNS64) form of a public IPv4 address: on an IPv6-only
    network that is how every IPv4-only receiver resolves."""
    dns[HOST] = address
    assert target_checked(f"https://{HOST}/hook").address == address


@pytest.mark.parametrize("address", list(EMBEDDING_FORMS))
def test_saving_such_an_endpoint_is_a_400_that_stores_nothing(school: School, address: str,
                                                              dns: dict[str, str]) -> None:
    client = Client()
    client.force_login(school.admin)
    dns[HOST] = address
    for url in (f"https://[{address}]/hook", f"https://{HOST}/hook"):
        response = client.post(reverse("dashboard:webhooks"), {"url": url, "event_types": ["*"]})
        assert response.status_code == 400
        assert "webhooks only go to public addresses" in response.content.decode()
    assert not WebhookEndpoint.objects.exists()
    assert not AuditEvent.objects.filter(action="webhook.created").exists()


@pytest.mark.parametrize("address", ["64:ff9b::a9fe:a9fe", "64:ff9b:1::a9fe:a9fe", "2002:a9fe:a9fe::1",
                                     "::a9fe:a9fe", "::ffff:a9fe:a9fe", "::ffff:0:a9fe:a9fe",
                                     "2001:0:4136:e378:8000:63bf:5601:5601"])
def test_a_name_that_later_resolves_to_such_a_form_is_refused_at_delivery(
        school: School, clock: Clock, queued: list[Any], dns: dict[str, str], address: str) -> None:
    dns[HOST] = "93.184.215.14"  # public when the admin registers the endpoint
    endpoint, _ = make_endpoint(school.org, f"https://{HOST}/hook")
    dispatch.fan_out(change_event(school.stack, 1))
    dns[HOST] = address  # then the name is pointed at the metadata service, dressed as IPv6

    assert run(endpoint, school.stack) == 0
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.status == WebhookDelivery.Status.PENDING and delivery.last_status_code is None
    assert delivery.last_error.startswith("refused:") and address in delivery.last_error, delivery.last_error
