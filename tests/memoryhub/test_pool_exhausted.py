"""While the database connection pool is exhausted, every page answers 503 with Retry-After in the
error contract, as the API does, never a 500 (memoryhub.errors.ServiceUnavailableMiddleware).

The real ASGI application is driven in-process, so requests run on the handler's own threads and
wait for the process's real pool; the test holds every one of its connections meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.db import connection, connections
from django.test import Client
from psycopg_pool import PoolTimeout

from memoryhub.asgi import application
from tests.actors import School

# The handler's threads use their own connections; slow: holds the whole pool until its timeout.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@contextmanager
def pool_exhausted() -> Iterator[None]:
    """Every connection of this process's pool checked out by the test until the block ends."""
    pool = connection.pool  # type: ignore[attr-defined]  # the postgresql backend's pool
    held: list[Any] = []
    try:
        # Up to max_size, not "until a short wait times out": the pool opens connections in the
        # background, and one still opening on a busy machine would serve a request meanwhile.
        while len(held) < pool.max_size:
            held.append(pool.getconn(timeout=30))
        with pytest.raises(PoolTimeout):
            pool.getconn(timeout=0.2)
        yield
    finally:
        for held_connection in held:
            pool.putconn(held_connection)


def _requests(*calls: tuple[str, dict[str, str]]) -> list[httpx.Response]:
    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=application)  # type: ignore[arg-type]  # ASGI types spelled loosely
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=30) as client:
            return list(await asyncio.gather(*(client.get(path, headers=headers) for path, headers in calls)))

    return asyncio.run(run())


def _is_unavailable(response: httpx.Response) -> Any:
    assert response.status_code == 503, (response.status_code, response.text[:300])
    assert int(response.headers["Retry-After"]) >= 1
    body = response.json()
    assert body["error"]["code"] == "service_unavailable" and body["detail"]
    return body


def test_dashboard_pages_answer_503_like_the_api_while_the_pool_is_exhausted(school: School) -> None:
    browser = Client()
    browser.force_login(school.admin)
    session = {"Cookie": f"{settings.SESSION_COOKIE_NAME}={browser.cookies[settings.SESSION_COOKIE_NAME].value}"}
    key = {"Authorization": f"Bearer {school.agent_secret}"}
    connections.close_all()
    with pool_exhausted():
        overview, student, api = _requests(("/dashboard/", session),
                                           (f"/dashboard/students/{school.stack.slug}/", session),
                                           (school.stack_url(), key))
    assert _is_unavailable(overview) == _is_unavailable(student) == _is_unavailable(api)
    # The pool back: the same pages answer again.
    assert [r.status_code for r in _requests(("/dashboard/", session), (school.stack_url(), key))] == [200, 200]
    connections.close_all()
