"""Two lanes for requests: interactive work is never made to wait behind bulk work
(docs/architecture.md §5.7 "Lanes").

* **Interactive** (search, load, get, checkpoint, single writes, dashboard pages): served at once.
* **Bulk** (large pushes, full pulls, exports; see `bulk_request`): at most `limit` run at a time
  in this web process. The limit adapts, in the manner of a gradient limiter: each interactive
  request's latency is compared with its route's unloaded latency (which only requests that ran
  beside no bulk work may raise, so a long flood is never taken for the norm); while interactive
  requests run more than `LANES_TOLERANCE` times slower than unloaded, the limit shrinks in
  proportion, and while they run near their baseline, or none arrive, it grows. Below one it
  paces: one bulk request at a time, then a pause, so that bulk work runs `limit` of the time
  (never below `LANES_MIN_BULK`, a share: a flood is slowed, never stopped).
* A bulk request over the limit waits in a bounded queue, taken round-robin by school, so one
  school's flood cannot hold the lane against another's. Past `LANES_MAX_WAIT_SECONDS`, or with the
  queue full, it is answered 503; a school holding more than its fair share of the lane while
  others wait is answered 429. Both carry Retry-After and happen before the request's body is
  applied: nothing is half-stored, and a client that retries loses nothing.

Per web process: each process protects its own threads and, through them, the database's cores.
`MEMORYHUB_LANES=off` (setting `LANES_ENABLED`) turns the bulk lane's limit off.
"""

from __future__ import annotations

import math
import random
import statistics
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from django.conf import settings
from django.http import HttpRequest, HttpResponseBase, JsonResponse

from memoryhub import redis_marks
from memoryhub.cpu_priority import lower_for_bulk
from memoryhub.errors import DomainError, error_body
from memoryhub.metrics import (
    BULK_LANE_LIMIT,
    BULK_LANE_REFUSALS,
    BULK_LANE_RUNNING,
    BULK_LANE_WAITING,
    INTERACTIVE_SLOWDOWN,
)
from memoryhub.worker_priority import BULK_QUEUED_KEY, PRESSURE_KEY

# How many of a route's latencies make one of its baseline windows, and how many interactive
# latencies (any route) one adjustment of the limit reads.
ROUTE_WINDOW = 16
ADJUST_SAMPLES = 12
# A route's baseline creeps up by this factor each window of requests that ran beside no bulk work,
# so a stack that really grew (slower even unloaded) is not mistaken for a loaded service for ever.
# A window beside bulk work may lower the baseline, never raise it: under a long flood the loaded
# latency would otherwise become the baseline, and the limit would let the flood back in.
BASELINE_DRIFT = 1.02
# With no interactive request for this long there is nobody to protect: the limit grows.
IDLE_GROWTH_SECONDS = 1.0
# How often a bulk request waiting under a limit below 1 looks whether its pause is over.
PACED_POLL_SECONDS = 0.02
# While a web process holds its bulk limit down it says so in Redis, at most this often, and the
# mark lapses PRESSURE_SECONDS after the last one: the runner then keeps the embedding worker
# yielding the cores even when it is behind (memoryhub.worker_priority).
PRESSURE_MARK_SECONDS = 1.0
PRESSURE_SECONDS = 10
# With this many bulk requests waiting for a place at once, bulk work is queuing, not meeting by
# chance (one waiter is two pushes that arrived together): a flood. The process marks it the same
# way, and while both marks stand the runner lets embedding wait (memoryhub.embedding_hold).
FLOOD_WAITING = 2


class BulkLaneFull(DomainError):
    """Bulk work past what this process runs now and its queue holds: retry after a while."""

    status = 503
    code = "bulk_lane_full"


class BulkFairShare(DomainError):
    """A school past its share of the bulk lane while other schools wait for it."""

    status = 429
    code = "bulk_fair_share"


@dataclass
class _Waiter:
    event: threading.Event = field(default_factory=threading.Event)
    granted: bool = False


class GradientLimit:
    """The adaptive limit on bulk work, fed with interactive latencies.

    `limit` >= 1 is how many bulk requests may run at once; under 1 it is the share of the time
    one may run (0.25: one at a time, idle three times as long as each took)."""

    def __init__(self, *, minimum: float, maximum: int, tolerance: float) -> None:
        self.minimum, self.maximum, self.tolerance = minimum, maximum, tolerance
        self.limit: float = maximum
        # The median of the latest interactive latencies against their routes' unloaded ones.
        self.slowdown = 1.0
        self._baselines: dict[str, float] = {}
        self._windows: dict[str, list[float]] = {}
        self._beside_bulk: set[str] = set()  # routes whose current window saw a request beside bulk work
        self._ratios: list[float] = []
        self._last_sample = time.monotonic()

    @property
    def concurrency(self) -> int:
        return max(1, math.floor(self.limit))

    def observe(self, route: str, seconds: float, *, beside_bulk: bool = False) -> bool:
        """Record one interactive latency, and whether bulk work ran in this process meanwhile;
        True when the limit changed."""
        self._last_sample = time.monotonic()
        window = self._windows.setdefault(route, [])
        window.append(seconds)
        if beside_bulk:
            self._beside_bulk.add(route)
        if len(window) >= ROUTE_WINDOW:
            median = statistics.median(window)
            window.clear()
            known = self._baselines.get(route)
            if known is None:
                self._baselines[route] = median
            else:
                drift = 1.0 if route in self._beside_bulk else BASELINE_DRIFT
                self._baselines[route] = min(median, known * drift)
            self._beside_bulk.discard(route)
        baseline = self._baselines.get(route)
        if baseline is None or baseline <= 0:
            return False
        self._ratios.append(seconds / baseline)
        if len(self._ratios) < ADJUST_SAMPLES:
            return False
        self.slowdown = statistics.median(self._ratios)
        self._ratios.clear()
        return self._adjust(self.slowdown)

    def grow_if_idle(self) -> bool:
        if time.monotonic() - self._last_sample < IDLE_GROWTH_SECONDS:
            return False
        self._last_sample = time.monotonic()
        self.slowdown = 1.0
        return self._adjust(1.0)

    def _adjust(self, ratio: float) -> bool:
        before = self.limit
        if ratio > self.tolerance:
            self.limit = max(self.minimum, self.limit * max(0.5, self.tolerance / ratio))
        elif ratio < 0.75 * self.tolerance:
            self.limit = min(self.maximum, self.limit * 2 if self.limit < 1 else math.floor(self.limit) + 1)
        return self.limit != before


class BulkLane:
    """The bulk lane of one process: a limit, the requests in it, and a fair bounded queue."""

    def __init__(self, *, minimum: float, maximum: int, tolerance: float, queue_size: int,
                 max_wait: float) -> None:
        self.gradient = GradientLimit(minimum=minimum, maximum=maximum, tolerance=tolerance)
        self.queue_size, self.max_wait = queue_size, max_wait
        self._lock = threading.Lock()
        self._running: dict[int, int] = {}  # school -> its bulk requests running now
        self._waiting: OrderedDict[int, deque[_Waiter]] = OrderedDict()  # by school, in turn order
        self._seconds = 1.0  # a bulk request's usual length (moving average)
        self._next_start = 0.0  # under a limit below 1: no bulk request starts before (monotonic)
        self._pressure_mark = _Mark(PRESSURE_KEY)
        self._flood_mark = _Mark(BULK_QUEUED_KEY)
        self._bulk_last_ran = -math.inf  # monotonic: when a bulk request last ended
        INTERACTIVE_SLOWDOWN.set(self.gradient.slowdown)  # then set again as the reading changes

    @property
    def running(self) -> int:
        return sum(self._running.values())

    def _has_room(self) -> bool:
        if self.running >= self.gradient.concurrency:
            return False
        return self.gradient.limit >= 1 or time.monotonic() >= self._next_start

    def acquire(self, school: int) -> Callable[[], None]:
        """A place in the lane for one request of `school`, or BulkLaneFull / BulkFairShare.
        Returns the release, to call once the request's work is over."""
        with self._lock:
            self.gradient.grow_if_idle()
            self._dispatch()
            waiting = sum(len(q) for q in self._waiting.values())
            if not waiting and self._has_room():
                return self._enter(school)
            if waiting >= self.queue_size:
                raise self._refusal(BulkLaneFull, "The service is busy with bulk work; retry after the "
                                                  "time in Retry-After. Nothing of this request was applied.")
            schools = set(self._running) | set(self._waiting) | {school}
            share = max(1, math.ceil((self.gradient.concurrency + self.queue_size) / len(schools)))
            mine = self._running.get(school, 0) + len(self._waiting.get(school, ()))
            if len(schools) > 1 and mine >= share:
                raise self._refusal(BulkFairShare, "This school holds its share of the service's bulk "
                                                   "work; retry after the time in Retry-After. Nothing of "
                                                   "this request was applied.")
            waiter = _Waiter()
            self._waiting.setdefault(school, deque()).append(waiter)
            self._dispatch()
            flood_due = waiting + 1 >= FLOOD_WAITING and not waiter.granted and self._flood_mark.due()
        if flood_due:
            self._flood_mark.write()
        deadline = time.monotonic() + self.max_wait
        while True:
            remaining = deadline - time.monotonic()
            # Paced (a limit below 1), a place opens when a pause ends, not on a release: look again soon.
            waited = waiter.event.wait(max(0.0, min(remaining, PACED_POLL_SECONDS)))
            with self._lock:
                if not waited:
                    self._dispatch()
                if waiter.granted:
                    return self._release_for(school, time.monotonic())
                if time.monotonic() < deadline:
                    continue
                self._waiting[school].remove(waiter)
                if not self._waiting[school]:
                    del self._waiting[school]
                self._dispatch()
                raise self._refusal(BulkLaneFull, "The service is busy with bulk work; retry after the time in "
                                                  "Retry-After. Nothing of this request was applied.")

    def observe_interactive(self, route: str, seconds: float) -> None:
        """Feed the limit one interactive request's latency, just as the request ends."""
        with self._lock:
            beside_bulk = self.running > 0 or self._bulk_last_ran > time.monotonic() - seconds
            slowdown = self.gradient.slowdown
            if self.gradient.observe(route, seconds, beside_bulk=beside_bulk):
                self._dispatch()
            elif self.gradient.slowdown != slowdown:  # a new reading every ADJUST_SAMPLES requests
                INTERACTIVE_SLOWDOWN.set(self.gradient.slowdown)
            due = self.gradient.limit < self.gradient.maximum and self._pressure_mark.due()
        if due:
            self._pressure_mark.write()

    def _enter(self, school: int) -> Callable[[], None]:
        self._running[school] = self._running.get(school, 0) + 1
        self._dispatch()
        return self._release_for(school, time.monotonic())

    def _release_for(self, school: int, started: float) -> Callable[[], None]:
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if released:
                    return
                released = True
                self._running[school] -= 1
                if not self._running[school]:
                    del self._running[school]
                self._bulk_last_ran = time.monotonic()
                took = self._bulk_last_ran - started
                self._seconds = 0.8 * self._seconds + 0.2 * took
                if self.gradient.limit < 1:
                    self._next_start = time.monotonic() + took * (1 / self.gradient.limit - 1)
                self._dispatch()

        return release

    def _dispatch(self) -> None:
        """Let waiters in, one school after another, while the limit allows (lock held)."""
        try:
            self._admit_waiters()
        finally:
            BULK_LANE_LIMIT.set(self.gradient.limit)
            INTERACTIVE_SLOWDOWN.set(self.gradient.slowdown)
            BULK_LANE_RUNNING.set(self.running)
            BULK_LANE_WAITING.set(sum(len(q) for q in self._waiting.values()))

    def _admit_waiters(self) -> None:
        while self._waiting and self._has_room():
            school, queue = next(iter(self._waiting.items()))
            waiter = queue.popleft()
            if queue:
                self._waiting.move_to_end(school)  # the next place goes to the next school
            else:
                del self._waiting[school]
            self._running[school] = self._running.get(school, 0) + 1
            waiter.granted = True
            waiter.event.set()

    def _refusal(self, error: type[DomainError], message: str) -> DomainError:
        waiting = sum(len(q) for q in self._waiting.values())
        expected = self._seconds * (waiting + 1) / self.gradient.limit
        seconds = min(30, max(1, round(expected * random.uniform(0.8, 1.2))))  # spread retries, not a secret
        refusal = error(message, fields={"retry_after": seconds})
        refusal.retry_after = seconds
        BULK_LANE_REFUSALS.labels(refusal.code).inc()
        return refusal


class _Mark:
    """One of this process's marks in Redis (memoryhub.redis_marks), written at most once each
    PRESSURE_MARK_SECONDS and lapsing PRESSURE_SECONDS after: `due()` under the lane's lock, then
    `write()` outside it, best effort (an unreachable Redis costs the mark, never the request)."""

    def __init__(self, key: str) -> None:
        self.key = key
        self._written = -PRESSURE_MARK_SECONDS  # monotonic

    def due(self) -> bool:
        now = time.monotonic()
        if now - self._written < PRESSURE_MARK_SECONDS:
            return False
        self._written = now
        return True

    def write(self) -> None:
        redis_marks.set_mark(redis_marks.client(settings.REDIS_URL), self.key, PRESSURE_SECONDS)


_lane: BulkLane | None = None
_lane_lock = threading.Lock()


def bulk_lane() -> BulkLane | None:
    """This process's bulk lane (None when lanes are off)."""
    global _lane
    if not settings.LANES_ENABLED:
        return None
    if _lane is None:
        with _lane_lock:
            if _lane is None:
                _lane = BulkLane(minimum=settings.LANES_MIN_BULK, maximum=settings.LANES_MAX_BULK,
                                 tolerance=settings.LANES_TOLERANCE, queue_size=settings.LANES_QUEUE,
                                 max_wait=settings.LANES_MAX_WAIT_SECONDS)
    return _lane


def enter_bulk_lane(request: HttpRequest, school: int) -> None:
    """Admit `request` to the bulk lane for `school`, or raise the 503 / 429 that says when to come
    back. The place is given back when the response is closed (`LaneMiddleware`)."""
    lane = bulk_lane()
    request.bulk_lane = True  # type: ignore[attr-defined]
    if lane is not None:
        request.bulk_release = lane.acquire(school)  # type: ignore[attr-defined]
        request.bulk_priority_restore = lower_for_bulk()  # type: ignore[attr-defined]


def bulk_request(request: HttpRequest) -> bool:
    """Is this push large enough to be bulk work? Its declared body size against LANES_BULK_BYTES."""
    declared = request.META.get("CONTENT_LENGTH") or ""
    return declared.isdigit() and int(declared) >= settings.LANES_BULK_BYTES


class _ReleasingChunks:
    """A streamed body's chunks that give the bulk lane's place back when closed. Django closes a
    streaming response's content when the response is closed, sent in full or not at all."""

    def __init__(self, chunks: Iterable[bytes], release: Callable[[], None] | None) -> None:
        self._chunks = iter(chunks)
        self._release = release

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        return next(self._chunks)

    def close(self) -> None:
        try:
            close = getattr(self._chunks, "close", None)
            if close is not None:
                close()
        finally:
            if self._release is not None:
                self._release()


def release_when_streamed(request: HttpRequest, chunks: Iterable[bytes]) -> Iterator[bytes]:
    """A streamed body that keeps the request's place in the bulk lane until it is sent."""
    release = getattr(request, "bulk_release", None)
    request.bulk_release = None  # type: ignore[attr-defined]  # the stream gives it back, not the middleware
    return _ReleasingChunks(chunks, release)


def too_late_response() -> HttpResponseBase:
    """503 for a request that waited for a thread past LANES_INTERACTIVE_DEADLINE_SECONDS."""
    response = JsonResponse(error_body("overloaded", "The service is overloaded; retry after the time in "
                                                     "Retry-After. Nothing of this request was applied."), status=503)
    response["Retry-After"] = str(random.randint(1, 3))  # spread retries, not a secret
    return response


# Routes whose latency says nothing of the service's load.
_UNMEASURED_PREFIXES = ("/healthz", "/readyz", "/metrics", "/static/")


class LaneMiddleware:
    """Times interactive requests for the bulk lane's limit, and gives a bulk request's place back
    once its response is done (docs/architecture.md §5.7)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        started = time.monotonic()
        try:
            response = self.get_response(request)
        finally:
            restore_priority = getattr(request, "bulk_priority_restore", None)
            if restore_priority is not None:
                restore_priority()  # on this thread, before its connection goes back to the pool
            release = getattr(request, "bulk_release", None)
            if release is not None:
                release()
        lane = bulk_lane()
        if lane is not None and not getattr(request, "bulk_lane", False) and not response.streaming \
                and not request.path.startswith(_UNMEASURED_PREFIXES):
            match = request.resolver_match
            lane.observe_interactive(match.route if match else request.path, time.monotonic() - started)
        return response
