"""The single-hop ASGI handler (memoryhub/asgi.py) keeps Django's request semantics: the real
ASGI application is driven in-process (httpx's ASGI transport, no socket), so the middleware,
authentication, throttles and CSRF run exactly as behind uvicorn, on the handler's own threads."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.db import connections
from django.test import Client
from django.utils import timezone

from accounts.models import ApiKey
from memoryhub.asgi import application
from stacks.models import Stack
from tests.factories import make_key, make_org, make_stack, make_user

pytestmark = pytest.mark.django_db(transaction=True)  # the handler's threads use their own connections


def _requests(*calls: tuple[str, str, dict[str, Any]]) -> list[httpx.Response]:
    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=application)  # type: ignore[arg-type]  # ASGI types spelled loosely
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            return [await client.request(method, path, **kwargs) for method, path, kwargs in calls]

    return asyncio.run(run())


def test_health_and_bearer_key_over_asgi() -> None:
    org = make_org()
    stack = make_stack(org, "ada")
    _, secret = make_key(org, stack=stack)
    auth = {"headers": {"Authorization": f"Bearer {secret}"}}
    health, detail, again = _requests(("GET", "/health", {}), ("GET", "/api/v1/stacks/ada/", auth),
                                      ("GET", "/api/v1/stacks/ada/", auth))
    assert health.status_code == 200
    assert detail.status_code == 200 and detail.json()["stack_id"] == "ada"
    assert again.json() == detail.json()


def test_revoked_expired_and_unknown_keys_are_401_over_asgi() -> None:
    org = make_org()
    stack = make_stack(org, "ada")
    revoked, revoked_secret = make_key(org, stack=stack)
    ApiKey.objects.filter(pk=revoked.pk).update(revoked_at=timezone.now())
    expired, expired_secret = make_key(org, stack=stack)
    ApiKey.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    responses = _requests(
        *[("GET", "/api/v1/stacks/ada/", {"headers": {"Authorization": f"Bearer {secret}"}})
          for secret in (revoked_secret, expired_secret, "knl_sk_" + "0" * 40)],
        ("GET", "/api/v1/stacks/ada/", {}),
    )
    assert [r.status_code for r in responses] == [401, 401, 401, 401]
    assert all(r.json()["error"]["code"] for r in responses)


def test_session_write_without_csrf_is_refused_and_stores_nothing_over_asgi() -> None:
    org = make_org()
    user = make_user(org)
    browser = Client()
    browser.force_login(user)
    cookie = {"Cookie": f"{settings.SESSION_COOKIE_NAME}={browser.cookies[settings.SESSION_COOKIE_NAME].value}"}
    token = "a" * 32  # an unmasked CSRF secret, sent as cookie and header as a browser would
    with_token = {"Cookie": f"{cookie['Cookie']}; {settings.CSRF_COOKIE_NAME}={token}", "X-CSRFToken": token}
    listed, refused, created = _requests(
        ("GET", "/api/v1/stacks/", {"headers": cookie}),
        ("POST", "/api/v1/stacks/", {"headers": cookie, "json": {"stack_id": "eve"}}),
        ("POST", "/api/v1/stacks/", {"headers": with_token, "json": {"stack_id": "ida"}}),
    )
    assert listed.status_code == 200
    assert refused.status_code == 403 and "CSRF" in refused.text
    assert not Stack.objects.filter(organization=org, slug="eve").exists()
    assert created.status_code == 201
    assert Stack.objects.filter(organization=org, slug="ida").exists()


@pytest.mark.usefixtures("throttle_clock")  # a pinned window: a minute boundary cannot split the three calls
def test_per_key_throttle_applies_over_asgi(settings: Any) -> None:
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK,
                               "DEFAULT_THROTTLE_RATES": {**settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"],
                                                          "request": "2/min"}}
    from accounts.throttles import throttle_state_clear

    throttle_state_clear()
    org = make_org()
    stack = make_stack(org, "ada")
    _, secret = make_key(org, stack=stack)
    auth = {"headers": {"Authorization": f"Bearer {secret}"}}
    codes = [r.status_code for r in _requests(*[("GET", "/api/v1/stacks/ada/", auth)] * 3)]
    assert codes == [200, 200, 429]
    throttle_state_clear()


def test_connections_go_back_after_each_request() -> None:
    """Each request returns its thread's DB connection (request_finished runs on that thread), so
    more requests than the pool holds, one after another, never wait for a connection."""
    org = make_org()
    stack = make_stack(org, "ada")
    _, secret = make_key(org, stack=stack)
    auth = {"headers": {"Authorization": f"Bearer {secret}"}}
    count = 3 * max(1, int(getattr(settings, "DB_POOL_MAX_SIZE", 0) or 1)) + 5
    codes = {r.status_code for r in _requests(*[("GET", "/api/v1/stacks/ada/", auth)] * count)}
    assert codes == {200}
    connections.close_all()
