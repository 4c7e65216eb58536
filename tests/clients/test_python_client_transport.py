"""The Python client's transport rules beyond the one real 429 of the live scenario
(tests/clients/test_python_client.py): 503 retried after Retry-After, waits capped, retries
bounded and then the refusal raised with its Retry-After, back-off without one, a body that is not
the error contract, a refused connection. Answers come from an in-process httpx transport standing
in for the network, so each rule is checked in milliseconds; no database is involved."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from memoryhub_client import (
    AsyncMemoryHub,
    MemoryHub,
    RateLimited,
    ServerError,
    ServiceUnavailable,
    TransportError,
)

ERROR_429 = {"error": {"code": "throttled", "message": "Slow down.", "fields": {}}, "detail": "Slow down."}
ERROR_503 = {"error": {"code": "service_unavailable", "message": "the database is unavailable; retry shortly",
                       "fields": {}}, "detail": "the database is unavailable; retry shortly"}


def scripted(answers: list[httpx.Response]) -> tuple[Callable[[httpx.Request], httpx.Response], list[httpx.Request]]:
    """A handler answering with `answers` in turn (the last one again once they run out)."""
    seen: list[httpx.Request] = []
    queue: Iterator[httpx.Response] = iter(answers)

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return next(queue, answers[-1])
    return handle, seen


def hub_for(answers: list[httpx.Response], *, max_retries: int = 3,
            max_backoff: float = 30.0) -> tuple[MemoryHub, list[httpx.Request]]:
    handle, seen = scripted(answers)
    http = httpx.Client(transport=httpx.MockTransport(handle))
    return MemoryHub("http://memoryhub.test", "knl_sk_test", agent_id="probe", http_client=http,
                     max_retries=max_retries, max_backoff=max_backoff), seen


def test_a_503_is_retried_after_its_retry_after_and_the_headers_go_every_time() -> None:
    hub, seen = hub_for([httpx.Response(503, json=ERROR_503, headers={"Retry-After": "0"}),
                         httpx.Response(503, json=ERROR_503, headers={"Retry-After": "0"}),
                         httpx.Response(200, json=[{"key": "tone", "value": "kind", "updated_at": "x"}])])
    assert hub.boot_config("ada") == {"tone": "kind"}
    assert len(seen) == 3
    assert {(r.headers["Authorization"], r.headers["X-Agent-Id"]) for r in seen} == {("Bearer knl_sk_test", "probe")}


def test_retries_are_bounded_then_the_refusal_is_raised_with_its_retry_after() -> None:
    hub, seen = hub_for([httpx.Response(429, json=ERROR_429, headers={"Retry-After": "0"})], max_retries=2)
    with pytest.raises(RateLimited) as refused:
        hub.remember("ada", content="x")
    assert len(seen) == 3  # the call and two retries
    assert (refused.value.status, refused.value.code, refused.value.retry_after) == (429, "throttled", 0.0)


def test_a_long_retry_after_is_capped_by_max_backoff() -> None:
    hub, seen = hub_for([httpx.Response(429, json=ERROR_429, headers={"Retry-After": "3600"}),
                         httpx.Response(200, json={"task": "t"})], max_backoff=0.05)
    started = time.monotonic()
    assert hub.checkpoint_latest("ada") == {"task": "t"}
    assert time.monotonic() - started < 2 and len(seen) == 2


def test_without_retry_after_the_back_off_grows_and_max_retries_zero_turns_retries_off() -> None:
    hub, seen = hub_for([httpx.Response(503, json=ERROR_503)], max_retries=0)
    with pytest.raises(ServiceUnavailable):
        hub.load("ada")
    assert len(seen) == 1
    waits = [hub.retry.delay(httpx.Response(503), attempt) for attempt in range(3)]
    assert waits == [None, None, None]  # max_retries=0
    policy = MemoryHub("http://x", "k", max_retries=5, max_backoff=1.5).retry
    delays = [wait for attempt in range(5) if (wait := policy.delay(httpx.Response(503), attempt)) is not None]
    assert len(delays) == 5 and delays == sorted(delays) and delays[0] < 1 and delays[-1] == 1.5


def test_an_answer_that_is_not_the_error_contract_still_raises_by_status() -> None:
    hub, _ = hub_for([httpx.Response(502, text="<html>Bad gateway</html>")])
    with pytest.raises(ServerError) as failed:
        hub.memory_md("ada")
    assert (failed.value.status, failed.value.code) == (502, "http_502")


def test_a_refused_connection_is_a_transport_error_after_its_retries() -> None:
    with MemoryHub("http://127.0.0.1:9", "knl_sk_test", max_retries=1, max_backoff=0.01) as hub, \
            pytest.raises(TransportError):
        hub.stack("ada")


def test_the_async_client_follows_the_same_rules() -> None:
    handle, seen = scripted([httpx.Response(503, json=ERROR_503, headers={"Retry-After": "0"}),
                             httpx.Response(200, json={"next": "http://memoryhub.test/api/v1/stacks/?cursor=abc",
                                                       "previous": None, "results": [{"stack_id": "ada"}]}),
                             httpx.Response(200, json={"next": None, "previous": None,
                                                       "results": [{"stack_id": "ben"}]})])

    async def scenario() -> list[str]:
        http = httpx.AsyncClient(transport=httpx.MockTransport(handle))
        async with AsyncMemoryHub("http://memoryhub.test", "knl_sk_test", http_client=http) as hub:
            found = [stack["stack_id"] async for stack in hub.stacks(page_size=1)]
        await http.aclose()
        return found
    assert asyncio.run(scenario()) == ["ada", "ben"]
    # The second page is asked for with the first page's cursor and the same page size.
    assert [dict(r.url.params) for r in seen] == [{"limit": "1"}, {"limit": "1"}, {"limit": "1", "cursor": "abc"}]
