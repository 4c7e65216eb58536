"""The flood benchmark's clients (bench/flood.py has the whole story and the command line): the
interactive readers, run in the benchmark's own process, and the pushers, run in a process of their
own (`run_pushers`, through a process pool) so that building and parsing 500-operation batches does
not delay the readers' event loop, whose clock every interactive latency is read from.

Every client comes from 127.0.0.1 with no X-Forwarded-For: keys are counted per key, whatever the
address they share. A pusher honours Retry-After on a 503 or 429: it sleeps that long, then sends
the same batch again (same record ids), as kernle keeps a refused batch queued.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
if str(BASE_DIR) not in sys.path:
    sys.path.insert(0, str(BASE_DIR))

from bench.soak_agents import (  # noqa: E402
    NO_ANSWER,
    WORDS,
    AgentClient,
    Answer,
    Recorder,
    Sample,
    kernle_ops,
    retry_after,
    server_timing,
)

# A refusal without Retry-After is waited out this long (and counted: the goal wants the header).
FALLBACK_WAIT_SECONDS = 1.0
# After no answer at all (timeout, connection error) the same batch is sent again after this long.
NO_ANSWER_WAIT_SECONDS = 1.0


@dataclass(frozen=True)
class Key:
    """An API key and the stack it works on (a school key may name any stack of its school)."""

    stack: str
    secret: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secret}"}


def refusal(response: Answer) -> tuple[str, bool]:
    """The error code of a non-2xx answer, and whether its body has the error contract's shape
    (`{"error": {"code", "message"}, "detail"}`, memoryhub/errors.py)."""
    try:
        body = response.json()
    except ValueError:
        return "(not JSON)", False
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return "(no error object)", False
    return str(error.get("code", "")), {"code", "message"} <= error.keys() and "detail" in body


async def wait_until(wall_time: float) -> None:
    """Sleep until a wall-clock instant: the readers and the pushers' process start together."""
    await asyncio.sleep(max(0.0, wall_time - time.time()))


class Reads(Recorder):
    """The readers' samples (`error`: a refusal's error code), with how many refusals broke the contract."""

    def __init__(self) -> None:
        super().__init__()
        self.without_retry_after = 0  # 503 / 429 answers that lacked Retry-After
        self.malformed = 0  # non-2xx answers whose body is not the error contract's

    def extend(self, other: Reads) -> None:
        self.samples.extend(other.samples)
        self.loop_lag_ms.extend(other.loop_lag_ms)
        self.without_retry_after += other.without_retry_after
        self.malformed += other.malformed


async def interactive(base_url: str, keys: list[Key], seconds: float, think: float, start_at: float) -> Reads:
    """One closed-loop reader per key for `seconds`, each alternating a search and a load of its key's
    stack with `think` seconds between (one key each: the per-key request budget is a reader's, not
    the crowd's). Also samples this event loop's own lag."""
    recorder, clients = Reads(), len(keys)
    async with AgentClient(base_url, clients * 2) as http:
        await wait_until(start_at)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds

        async def client(n: int) -> None:
            key, rng = keys[n], random.Random(n)
            base = f"/api/v1/stacks/{key.stack}"
            op = "search" if n % 2 == 0 else "load"
            await asyncio.sleep(rng.uniform(0, think))
            while loop.time() < deadline:
                started = time.monotonic()
                try:
                    if op == "search":
                        response = await http.post(f"{base}/search", headers=key.headers,
                                                   json={"query": " ".join(rng.sample(WORDS, 2)), "limit": 10})
                    else:
                        response = await http.get(f"{base}/load", headers=key.headers)
                    status, error = response.status_code, ""
                    served = server_timing(response.headers.get("server-timing", ""))
                    if status >= 300:
                        error, well_formed = refusal(response)
                        recorder.malformed += not well_formed
                        if status in (429, 503) and retry_after(response) is None:
                            recorder.without_retry_after += 1
                except NO_ANSWER as exc:
                    status, error, served = 0, type(exc).__name__, None
                recorder.samples.append(Sample(op, started, (time.monotonic() - started) * 1000, status, error,
                                               served=served))
                op = "load" if op == "search" else "search"
                await asyncio.sleep(think)

        async def watch_lag() -> None:
            while loop.time() < deadline:
                asked = loop.time()
                await asyncio.sleep(0.05)
                recorder.loop_lag_ms.append((loop.time() - asked - 0.05) * 1000)

        await asyncio.gather(*(client(n) for n in range(clients)), watch_lag())
    return recorder


@dataclass
class PushResult:
    """What the pushers of one phase did (picklable: it comes back from the pushers' process)."""

    seconds: float = 0.0  # from the start to the last answer
    statuses: Counter[int] = field(default_factory=Counter)  # every answer by status (0: none)
    codes: Counter[tuple[int, str]] = field(default_factory=Counter)  # non-2xx by (status, error code)
    without_retry_after: int = 0  # 503 / 429 answers that lacked Retry-After
    malformed: int = 0  # non-2xx answers whose body is not the error contract's
    resent: int = 0  # batches sent again after a refusal or no answer
    waited_seconds: float = 0.0  # slept on Retry-After
    acked: list[str] = field(default_factory=list)  # record ids of acknowledged operations
    acked_ops: int = 0
    pushes_ok: Counter[str] = field(default_factory=Counter)  # acknowledged pushes per key's stack
    latencies_ms: list[float] = field(default_factory=list)  # of 200 answers

    def merge(self, other: PushResult) -> None:
        self.seconds = max(self.seconds, other.seconds)
        self.statuses.update(other.statuses)
        self.codes.update(other.codes)
        self.without_retry_after += other.without_retry_after
        self.malformed += other.malformed
        self.resent += other.resent
        self.waited_seconds += other.waited_seconds
        self.acked.extend(other.acked)
        self.acked_ops += other.acked_ops
        self.pushes_ok.update(other.pushes_ok)
        self.latencies_ms.extend(other.latencies_ms)


async def pusher(http: AgentClient, keys: list[Key], batch: int, interval: float, deadline: float,
                 seed: int, result: PushResult, *, once: bool = False, first_after: float = 0.0) -> None:
    """Push `batch`-operation batches until `deadline` (monotonic), the first `first_after` seconds
    from now, the next batch with the next of `keys`, one every `interval` seconds at most (0:
    without pause); `once`: one batch only. A 503 / 429 is waited out (Retry-After) and the same
    batch sent again; no answer: the same batch again after a second."""
    rng = random.Random(seed)
    turn = 0
    next_at = time.monotonic() + first_after
    while time.monotonic() < deadline:
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        next_at = max(next_at + interval, time.monotonic()) if interval else 0.0
        key = keys[turn % len(keys)]
        turn += 1
        ops = kernle_ops(rng, key.stack, batch)
        body: dict[str, Any] = {"stack_id": key.stack, "operations": ops}
        while time.monotonic() < deadline:
            started = time.monotonic()
            try:
                response = await http.post("/sync/push", json=body, headers=key.headers)
            except NO_ANSWER:
                result.statuses[0] += 1
                result.resent += 1
                await asyncio.sleep(NO_ANSWER_WAIT_SECONDS)
                continue
            status = response.status_code
            result.statuses[status] += 1
            if status == 200:
                result.latencies_ms.append((time.monotonic() - started) * 1000)
                refused = {c.get("record_id") for c in response.json().get("conflicts") or []}
                acked = [o["record_id"] for o in ops if o["record_id"] not in refused]
                result.acked.extend(acked)
                result.acked_ops += len(acked)
                result.pushes_ok[key.stack] += 1
                break
            code, well_formed = refusal(response)
            result.codes[(status, code)] += 1
            result.malformed += not well_formed
            if status not in (429, 503):
                await asyncio.sleep(0.5)  # a failure of its own: this batch is dropped, the next one goes
                break
            wait = retry_after(response)
            if wait is None:
                result.without_retry_after += 1
                wait = FALLBACK_WAIT_SECONDS
            wait = min(wait, max(0.0, deadline - time.monotonic()))
            result.waited_seconds += wait
            result.resent += 1
            await asyncio.sleep(wait)
        if once:
            return


async def _pushers(base_url: str, pushers: list[list[Key]], seconds: float, batch: int, interval: float,
                   start_at: float, seed: int) -> PushResult:
    result = PushResult()
    async with AgentClient(base_url, len(pushers) * 2) as http:
        await wait_until(start_at)
        started = time.monotonic()
        # Paced pushers are agents of their own, not a clock's ticks: their first pushes are spread
        # evenly over one interval, so they do not all arrive in the same instant every interval.
        await asyncio.gather(*(pusher(http, keys, batch, interval, started + seconds, seed * 1000 + n, result,
                                      first_after=n * interval / len(pushers))
                               for n, keys in enumerate(pushers)))
        result.seconds = time.monotonic() - started
    return result


def run_pushers(base_url: str, pushers: list[list[Key]], seconds: float, batch: int, interval: float,
                start_at: float, seed: int) -> PushResult:
    """Entry point in the pushers' process: every pusher (its keys in turn) for `seconds` from the
    wall-clock `start_at`."""
    return asyncio.run(_pushers(base_url, pushers, seconds, batch, interval, start_at, seed))


async def seed(base_url: str, keys: list[Key], memories: int) -> PushResult:
    """`memories` notes into each key's stack, by kernle pushes of up to 500, one stack at a time."""
    result = PushResult()
    started = time.monotonic()
    async with AgentClient(base_url, 2) as http:
        for n, key in enumerate(keys):
            for first in range(0, memories, 500):
                await pusher(http, [key], min(500, memories - first), 0.0, time.monotonic() + 300, n, result,
                             once=True)
    result.seconds = time.monotonic() - started
    return result


def warm_up() -> bool:
    """Run once in the pushers' process before the clock starts: its imports are paid there."""
    return True
