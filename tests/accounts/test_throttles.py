"""Redis-backed rate limits per IP and per credential, and failing closed when Redis is gone.

Every test runs on a pinned throttle clock (conftest `throttle_clock`): the counters are real Redis,
but the window a request falls in is the test's to choose, never the wall clock's minute."""

from __future__ import annotations

import copy
from pathlib import Path
from secrets import token_hex
from typing import Any

import pytest
from django.conf import settings
from django.test import RequestFactory, override_settings
from rest_framework.test import APIClient

from accounts.models import ApiKey, User
from accounts.network import client_ip
from accounts.throttles import SYNC_PULL_THROTTLES, SYNC_PUSH_THROTTLES, parse_rate
from memoryhub.embedded import EmbeddedRedis, free_port
from stacks.models import Stack
from tests.actors import FrozenClock
from tests.factories import bearer_client, make_key, make_org, make_stack

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("throttle_clock")]


def register(n: int, **meta: Any):
    return APIClient().post("/auth/register", {"stack_id": f"agent-{n}"}, format="json", **meta)


def test_register_allows_5_per_minute_per_ip_then_429_with_retry_after() -> None:
    for n in range(5):
        assert register(n).status_code == 201
    response = register(99)
    assert response.status_code == 429
    assert int(response["Retry-After"]) == 30  # the pinned clock is half-way through its minute
    assert response.json()["detail"] and response.json()["error"]["code"] == "throttled"
    assert User.objects.count() == 5 and not Stack.objects.filter(slug="agent-99").exists()


def test_the_next_window_starts_a_fresh_count(throttle_clock: FrozenClock) -> None:
    for n in range(5):
        assert register(n).status_code == 201
    throttle_clock.advance(29)  # still the same minute
    assert register(5).status_code == 429
    throttle_clock.advance(1)  # the next minute's window
    assert register(6).status_code == 201


@override_settings(TRUSTED_PROXIES=["10.0.0.0/8"])
def test_forwarded_for_from_a_trusted_proxy_separates_clients() -> None:
    for n in range(5):
        assert register(n, REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR="203.0.113.7").status_code == 201
    assert register(5, REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR="203.0.113.7").status_code == 429
    assert register(6, REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR="203.0.113.8").status_code == 201


def test_forwarded_for_from_an_untrusted_peer_is_ignored() -> None:
    for n in range(5):
        spoofed = f"198.51.100.{n}"
        assert register(n, REMOTE_ADDR="203.0.113.50", HTTP_X_FORWARDED_FOR=spoofed).status_code == 201
    assert register(5, REMOTE_ADDR="203.0.113.50", HTTP_X_FORWARDED_FOR="198.51.100.200").status_code == 429


@pytest.mark.parametrize(("remote", "forwarded", "trusted", "expected"), [
    ("203.0.113.9", "", ["10.0.0.0/8"], "203.0.113.9"),
    ("203.0.113.9", "1.2.3.4", ["10.0.0.0/8"], "203.0.113.9"),          # untrusted peer: header ignored
    ("10.0.0.1", "1.2.3.4", ["10.0.0.0/8"], "1.2.3.4"),
    ("10.0.0.1", "6.6.6.6, 1.2.3.4, 10.0.0.7", ["10.0.0.0/8"], "1.2.3.4"),  # rightmost untrusted hop
    ("10.0.0.1", "garbage", ["10.0.0.0/8"], "10.0.0.1"),
    ("10.0.0.1", "1.2.3.4", [], "10.0.0.1"),                            # no proxies configured
    ("::1", "2001:db8::1", ["::1/128"], "2001:db8::1"),
    ("10.0.0.1", "[2001:db8::2]:443", ["10.0.0.0/8"], "2001:db8::2"),
    ("", "1.2.3.4", ["10.0.0.0/8"], "unknown"),
])
def test_client_ip(remote: str, forwarded: str, trusted: list[str], expected: str) -> None:
    request = RequestFactory().get("/", REMOTE_ADDR=remote, HTTP_X_FORWARDED_FOR=forwarded)
    with override_settings(TRUSTED_PROXIES=trusted):
        assert client_ip(request) == expected


def test_login_counts_failed_attempts_per_ip_then_429_even_for_a_good_key() -> None:
    _, secret = make_key(make_org())
    for _ in range(30):  # random keys: distinct prefixes, so only the login route's own limit counts
        assert bearer_client("knl_sk_" + token_hex(16)).post("/auth/login").status_code == 401
    response = bearer_client(secret).post("/auth/login")
    assert response.status_code == 429 and response["Retry-After"]


def test_key_create_allows_10_per_minute() -> None:
    body = APIClient().post("/auth/register", {"stack_id": "k"}, format="json").json()
    client = bearer_client(body["secret"])
    for n in range(10):
        assert client.post("/auth/keys", {"name": f"k{n}"}, format="json").status_code == 201
    assert client.post("/auth/keys", {"name": "one-too-many"}, format="json").status_code == 429
    assert not ApiKey.objects.filter(name="one-too-many").exists()


def test_default_request_throttle_counts_per_credential() -> None:
    org = make_org()
    _, first = make_key(org)
    _, second = make_key(org)
    rest: dict[str, Any] = copy.deepcopy(settings.REST_FRAMEWORK)
    rest["DEFAULT_THROTTLE_RATES"]["request"] = "3/min"
    with override_settings(REST_FRAMEWORK=rest):
        for _ in range(3):
            assert bearer_client(first).get("/api/v1/stacks/").status_code == 200
        assert bearer_client(first).get("/api/v1/stacks/").status_code == 429
        assert bearer_client(second).get("/api/v1/stacks/").status_code == 200


def test_sync_throttle_scopes_exist_for_the_sync_views() -> None:
    # Each scope's per-IP and per-credential pair, and the school's share of the service.
    assert {getattr(t, "scope", None) for t in SYNC_PUSH_THROTTLES} == {"sync_push", "school"}
    assert {getattr(t, "scope", None) for t in SYNC_PULL_THROTTLES} == {"sync_pull", "school"}
    rates: dict[str, str] = settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]  # type: ignore[assignment]
    assert parse_rate(rates["sync_push"]) == parse_rate(rates["sync_pull"]) == (60, 60)
    assert parse_rate(rates["register"]) == (5, 60) and parse_rate(rates["login"]) == (30, 60)
    assert parse_rate(rates["key_create"]) == (10, 60)


def test_with_redis_stopped_requests_fail_closed_with_503(tmp_path: Path) -> None:
    org = make_org()
    _, secret = make_key(org, stack=make_stack(org, "s1"))
    own_redis = EmbeddedRedis(tmp_path / "redis", free_port())
    own_redis.prepare()
    own_redis.start()
    caches = copy.deepcopy(settings.CACHES)
    caches["default"]["LOCATION"] = own_redis.url()
    try:
        with override_settings(CACHES=caches):
            assert bearer_client(secret).get("/api/v1/stacks/").status_code == 200
            own_redis.process.stop()  # SIGTERM to the real redis-server
            response = bearer_client(secret).get("/api/v1/stacks/")
            assert response.status_code == 503, response.content
            assert response["Retry-After"]
            assert response.json()["error"]["code"] == "service_unavailable"
            # Anonymous throttled routes fail closed too, and store nothing.
            users = User.objects.count()
            registered = APIClient().post("/auth/register", {"stack_id": "while-down"}, format="json")
            assert registered.status_code == 503
            assert User.objects.count() == users and not Stack.objects.filter(slug="while-down").exists()
            assert bearer_client(secret).post("/auth/login").status_code == 503
    finally:
        own_redis.stop()
