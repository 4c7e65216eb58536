"""The two lanes (memoryhub.lanes, docs/architecture.md §5.7): bulk work waits or is refused with
Retry-After before anything of it is applied; interactive work never waits behind it; schools take
turns; the limit follows interactive latency."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from prometheus_client import REGISTRY

from accounts.models import AuditEvent
from memories.models import Memory
from memoryhub import lanes
from memoryhub.asgi import SingleHopASGIHandler
from memoryhub.lanes import BulkFairShare, BulkLane, BulkLaneFull, GradientLimit
from memoryhub.redis_marks import mark_reader
from memoryhub.worker_priority import BULK_QUEUED_KEY, PRESSURE_KEY
from stacks.services import personal_account_register
from tests.factories import bearer_client, kernle_note_inserts, make_org, make_stack, make_user, session_client

SCHOOL_A, SCHOOL_B = 1, 2


def lane(*, limit: int = 1, queue: int = 4, wait: float = 5.0) -> BulkLane:
    return BulkLane(minimum=1, maximum=limit, tolerance=2.0, queue_size=queue, max_wait=wait)


def in_thread(lane: BulkLane, school: int, admitted: list[int], released: threading.Event) -> threading.Thread:
    """A bulk request of `school` that, once admitted, holds its place until `released` is set."""
    def request() -> None:
        release = lane.acquire(school)
        admitted.append(school)
        released.wait(10)
        release()
    thread = threading.Thread(target=request, daemon=True)
    thread.start()
    return thread


def wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 5
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def waiting(lane: BulkLane) -> int:
    return sum(len(queue) for queue in lane._waiting.values())


def queue_up(lane: BulkLane, schools: list[int], admitted: list[int],
             released: threading.Event) -> list[threading.Thread]:
    """Bulk requests of `schools`, in this order: each is waiting in the queue before the next starts."""
    threads = []
    for school in schools:
        expected = waiting(lane) + 1
        threads.append(in_thread(lane, school, admitted, released))
        wait_for(lambda: waiting(lane) == expected)  # noqa: B023 - waited for before the loop goes on
    return threads


def test_a_request_over_the_limit_waits_for_a_place_then_gets_it() -> None:
    bulk = lane(limit=1)
    release_first = bulk.acquire(SCHOOL_A)
    admitted: list[int] = []
    go = threading.Event()
    thread = in_thread(bulk, SCHOOL_A, admitted, go)
    wait_for(lambda: waiting(bulk) == 1)
    assert admitted == []  # the limit holds
    release_first()
    wait_for(lambda: admitted == [SCHOOL_A])
    go.set()
    thread.join()
    assert bulk.running == 0


def test_with_the_queue_full_a_request_is_refused_at_once_with_retry_after() -> None:
    bulk = lane(limit=1, queue=0)
    release = bulk.acquire(SCHOOL_A)
    started = time.monotonic()
    with pytest.raises(BulkLaneFull) as refused:
        bulk.acquire(SCHOOL_A)
    assert time.monotonic() - started < 0.5
    assert refused.value.status == 503 and 1 <= (refused.value.retry_after or 0) <= 30
    release()
    bulk.acquire(SCHOOL_A)()  # the place is free again


def test_a_request_that_waits_too_long_is_refused_and_leaves_the_queue() -> None:
    bulk = lane(limit=1, wait=0.2)
    release = bulk.acquire(SCHOOL_A)
    with pytest.raises(BulkLaneFull):
        bulk.acquire(SCHOOL_A)
    assert waiting(bulk) == 0 and bulk.running == 1
    release()


def test_schools_take_turns_and_a_school_past_its_share_gets_429() -> None:
    bulk = lane(limit=1, queue=4)
    release = bulk.acquire(SCHOOL_A)
    admitted: list[int] = []
    go = threading.Event()
    threads = queue_up(bulk, [SCHOOL_A, SCHOOL_A, SCHOOL_B], admitted, go)  # B arrives last, served second
    # A holds one place and waits for two: with B waiting, that is A's share (ceil((1 + 4) / 2)).
    with pytest.raises(BulkFairShare) as refused:
        bulk.acquire(SCHOOL_A)
    assert refused.value.status == 429 and refused.value.retry_after
    go.set()  # each admitted request finishes at once, letting the next in
    release()
    for thread in threads:
        thread.join()
    assert admitted == [SCHOOL_A, SCHOOL_B, SCHOOL_A]


def test_slow_interactive_requests_shrink_the_limit_and_fast_ones_grow_it_back() -> None:
    gradient = GradientLimit(minimum=1, maximum=8, tolerance=2.0)
    for _ in range(32):
        gradient.observe("search", 0.020)  # unloaded
    assert gradient.limit == 8
    for _ in range(96):
        gradient.observe("search", 0.100)  # five times slower than unloaded
    assert gradient.limit == 1
    for _ in range(24 * 8):
        gradient.observe("search", 0.021)
    assert gradient.limit == 8


def test_with_the_shipped_settings_a_flood_is_paced_to_its_floor_and_no_lower(settings: Any) -> None:
    """Interactive requests at 1.6x their unloaded latency beside a flood: the lane paces bulk work
    below one request at a time, down to LANES_MIN_BULK_PERCENT of the time and never under it
    (docs/architecture.md §5.7)."""
    gradient = GradientLimit(minimum=settings.LANES_MIN_BULK, maximum=settings.LANES_MAX_BULK,
                             tolerance=settings.LANES_TOLERANCE)
    for _ in range(32):
        gradient.observe("search", 0.020)  # unloaded
    for _ in range(200 * 16):
        gradient.observe("search", 0.032, beside_bulk=True)
    assert gradient.limit < 1
    assert gradient.limit == settings.LANES_MIN_BULK >= 0.5


def test_a_long_flood_never_becomes_the_baseline_but_a_slower_quiet_stack_does() -> None:
    gradient = GradientLimit(minimum=1, maximum=8, tolerance=2.0)
    for _ in range(32):
        gradient.observe("search", 0.020)  # unloaded
    # Five times slower for 200 windows, every request beside bulk work: the limit stays down.
    for _ in range(200 * 16):
        gradient.observe("search", 0.100, beside_bulk=True)
    assert gradient.limit == 1
    # The same latency with no bulk work running is the route's own: the baseline follows it.
    for _ in range(200 * 16):
        gradient.observe("search", 0.100)
    assert gradient.limit == 8


def test_the_lane_tells_requests_beside_its_bulk_work_from_those_after_it() -> None:
    bulk = lane(limit=4)
    for _ in range(32):
        bulk.observe_interactive("search", 0.020)  # unloaded
    release = bulk.acquire(SCHOOL_A)
    for _ in range(200 * 16):  # three times slower while the bulk request runs
        bulk.observe_interactive("search", 0.060)
    assert bulk.gradient.limit == 1
    release()
    for _ in range(400 * 16):  # ending after it, but begun a second before: beside it too
        bulk.observe_interactive("search", 1.0)
    assert bulk.gradient.limit == 1
    time.sleep(0.1)
    for _ in range(200 * 16):  # three times slower, but each began after the bulk request ended
        bulk.observe_interactive("search", 0.060)
    assert bulk.gradient.limit == 4


# --- over HTTP --------------------------------------------------------------------------------------

@pytest.fixture
def full_lane(monkeypatch: pytest.MonkeyPatch, settings: Any) -> Iterator[Callable[[], None]]:
    """This process's bulk lane, with its one place taken and no queue; yields the place's release."""
    settings.LANES_BULK_BYTES = 2000
    bulk = lane(limit=1, queue=0)
    monkeypatch.setattr(lanes, "_lane", bulk)
    release = bulk.acquire(SCHOOL_A)
    yield release
    release()


@pytest.mark.django_db
def test_a_bulk_push_past_the_lane_is_503_with_retry_after_and_stores_nothing(
        full_lane: Callable[[], None]) -> None:
    account = personal_account_register(stack_id="flood", email="flood@example.test")
    client = bearer_client(account.secret)
    body = {"stack_id": "flood", "operations": kernle_note_inserts(20)}
    refused = client.post("/sync/push", body, format="json")
    assert refused.status_code == 503, refused.content
    assert refused.json()["error"]["code"] == "bulk_lane_full"
    assert 1 <= int(refused["Retry-After"]) <= 30
    assert Memory.objects.count() == 0
    small = client.post("/sync/push", {"stack_id": "flood", "operations": kernle_note_inserts(1)}, format="json")
    assert small.status_code == 200  # interactive: not behind the bulk lane
    assert client.post("/api/v1/stacks/flood/search", {"query": "fractions"}, format="json").status_code == 200
    full_lane()
    again = client.post("/sync/push", body, format="json")  # the retry the client makes
    assert again.status_code == 200 and len(again.json()["acknowledged_operations"]) == 20
    assert Memory.objects.count() == 21
    assert lanes._lane is not None and lanes._lane.running == 0  # the place was given back


@pytest.mark.django_db
def test_a_full_pull_and_an_archive_wait_in_the_bulk_lane_a_pull_since_does_not(
        full_lane: Callable[[], None]) -> None:
    account = personal_account_register(stack_id="reader", email="reader@example.test")
    client = bearer_client(account.secret)
    assert client.post("/sync/pull", {"stack_id": "reader"}, format="json").status_code == 503
    assert client.get("/api/v1/stacks/reader/export/archive").status_code == 503
    since = client.post("/sync/pull", {"stack_id": "reader", "since": "2026-11-01T00:00:00+00:00"}, format="json")
    assert since.status_code == 200
    full_lane()
    archive = client.get("/api/v1/stacks/reader/export/archive")
    assert archive.status_code == 200
    assert lanes._lane is not None and lanes._lane.running == 1  # held while the body streams
    b"".join(archive.streaming_content)  # type: ignore[attr-defined]
    archive.close()
    assert lanes._lane.running == 0


def test_a_request_that_waited_past_its_deadline_for_a_thread_is_shed_unserved() -> None:
    handler = SingleHopASGIHandler()
    late = time.monotonic() - handler._deadline - 1
    response, after = handler._serve({"type": "http", "path": "/api/v1/stacks/x/search"}, None, late)
    assert response.status_code == 503 and int(response["Retry-After"]) >= 1
    assert after == []


def test_under_a_limit_below_one_bulk_requests_run_one_at_a_time_with_pauses() -> None:
    """A limit of 0.5: each bulk request is followed by a pause as long as it took, so bulk work
    runs half the time; a request arriving in the pause waits for its end, not for a release."""
    bulk = lane(limit=1, wait=5.0)
    bulk.gradient.limit = 0.5
    release = bulk.acquire(SCHOOL_A)
    time.sleep(0.2)
    release()
    started = time.monotonic()
    bulk.acquire(SCHOOL_B)()
    assert time.monotonic() - started >= 0.18


def test_a_lane_holding_bulk_back_marks_the_pressure_the_runner_reads(settings: Any) -> None:
    """While its limit is below the maximum the lane says so in Redis (memoryhub.worker_priority
    keeps the embedding worker yielding then); at its maximum it marks nothing."""
    pressed = mark_reader(settings.REDIS_URL, PRESSURE_KEY)
    redis.Redis.from_url(settings.REDIS_URL).delete(PRESSURE_KEY)
    bulk = lane(limit=4)
    for _ in range(40):
        bulk.observe_interactive("search", 0.020)
    assert not pressed()
    for _ in range(24):
        bulk.observe_interactive("search", 0.200)
    assert bulk.gradient.limit < 4 and pressed()
    redis.Redis.from_url(settings.REDIS_URL).delete(PRESSURE_KEY)


def test_the_interactive_slowdown_is_exported_for_operators(settings: Any) -> None:
    """/metrics says how many times slower than unloaded interactive requests run now."""
    bulk = lane(limit=4)
    for _ in range(32):
        bulk.observe_interactive("search", 0.020)
    assert REGISTRY.get_sample_value("memoryhub_interactive_slowdown") == pytest.approx(1.0)
    for _ in range(12):
        bulk.observe_interactive("search", 0.100)
    assert REGISTRY.get_sample_value("memoryhub_interactive_slowdown") == pytest.approx(5.0)
    # No interactive request for a while: the next bulk request finds the process idle, reading 1.
    bulk.gradient._last_sample -= lanes.IDLE_GROWTH_SECONDS
    bulk.acquire(SCHOOL_A)()
    assert REGISTRY.get_sample_value("memoryhub_interactive_slowdown") == pytest.approx(1.0)
    redis.Redis.from_url(settings.REDIS_URL).delete(PRESSURE_KEY)


def test_bulk_requests_queuing_for_the_lane_mark_a_flood_and_one_waiting_does_not(settings: Any) -> None:
    """One bulk request waiting behind another is two pushes meeting by chance; two waiting at once
    is bulk work queuing, which the lane marks for the runner (its embedding hold)."""
    flooded = mark_reader(settings.REDIS_URL, BULK_QUEUED_KEY)
    redis.Redis.from_url(settings.REDIS_URL).delete(BULK_QUEUED_KEY)
    bulk = lane(limit=1, queue=4)
    release = bulk.acquire(SCHOOL_A)
    admitted: list[int] = []
    go = threading.Event()
    threads = queue_up(bulk, [SCHOOL_A], admitted, go)
    time.sleep(0.3)  # a queued request writes the mark just after it is counted: give it the time
    assert not flooded()
    threads += queue_up(bulk, [SCHOOL_B], admitted, go)
    wait_for(flooded)
    release()
    go.set()
    for thread in threads:
        thread.join()
    assert sorted(admitted) == [SCHOOL_A, SCHOOL_B]
    redis.Redis.from_url(settings.REDIS_URL).delete(BULK_QUEUED_KEY)


@pytest.mark.django_db
@pytest.mark.parametrize("download", ["archive.zip", "export.json"])
def test_a_dashboard_download_waits_in_the_bulk_lane_and_a_refusal_records_nothing(
        full_lane: Callable[[], None], download: str) -> None:
    org = make_org()
    stack = make_stack(org)
    browser = session_client(make_user(org))
    url = f"/dashboard/students/{stack.slug}/{download}"
    refused = browser.get(url)
    assert refused.status_code == 503
    assert 1 <= int(refused["Retry-After"]) <= 30
    assert "busy" in refused.content.decode().lower() or "retry" in refused.content.decode().lower()
    assert not AuditEvent.objects.filter(action="stack.exported").exists()
    full_lane()
    served = browser.get(url)
    assert served.status_code == 200
    assert lanes._lane is not None and lanes._lane.running == 1  # held while the body streams
    assert AuditEvent.objects.filter(action="stack.exported").count() == 1
    b"".join(served.streaming_content)  # type: ignore[attr-defined]
    served.close()
    assert lanes._lane.running == 0
