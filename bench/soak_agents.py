"""The soak's load generator (bench/soak.py has the whole story and the command line): the agents,
their mixes of operations, the open loop of the soak and the closed loop of --saturate / --compare,
the live student pages, the bare-psycopg comparison, and this process's own priority.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
if str(BASE_DIR) not in sys.path:
    sys.path.insert(0, str(BASE_DIR))

import aiohttp  # noqa: E402

from bench.service import RunnerService  # noqa: E402
from memoryhub.embedded import session_group_nice, set_session_group_nice  # noqa: E402


@dataclass(frozen=True)
class Mix:
    """Which operations, how often (weights), and how many operations a push carries."""

    weights: dict[str, int]
    push_sizes: tuple[tuple[int, int, int], ...]  # (weight %, smallest, largest) operations per push

    def pick_op(self, rng: random.Random) -> str:
        return rng.choices(list(self.weights), list(self.weights.values()))[0]

    def push_size(self, rng: random.Random) -> int:
        _, low, high = rng.choices(self.push_sizes, [w for w, _, _ in self.push_sizes])[0]
        return rng.randint(low, high)

    def memories_per_request(self) -> float:
        """Memories a request writes on average: what the embedding has to keep up with."""
        total = sum(self.weights.values())
        pushed = sum(w * (low + high) / 2 for w, low, high in self.push_sizes) / sum(w for w, _, _ in self.push_sizes)
        return (self.weights.get("push", 0) * pushed + self.weights.get("write", 0)) / total


MIXES = {
    # The agents' pace (the module doc): they read more than they write and sync in between.
    "agents": Mix({"search": 30, "load": 15, "write": 20, "push": 20, "pull": 15},
                  ((80, 1, 5), (17, 6, 50), (3, 51, 500))),
    # The first probe's mix (its figure: docs/benchmarks.md "Soak"): pushes of 10 operations, pulls and searches 4:2:4.
    "probe": Mix({"push": 40, "pull": 20, "search": 40}, ((100, 10, 10),)),
}
MIX = MIXES["agents"]
# A push of this many bytes or more is bulk work for the service (the default of its LANES_BULK_BYTES,
# docs/architecture.md §5.7): the soak reports those pushes on their own row, without a latency goal.
BULK_PUSH_BYTES = 32 * 1024
BULK_PUSH = "push (bulk lane)"
WORDS = (
    "fractions", "decimals", "algebra", "geometry", "reading", "phonics", "essay", "grammar", "spelling",
    "history", "biology", "chemistry", "physics", "homework", "quiz", "exam", "practice", "review", "lesson",
    "teacher", "tutor", "struggled", "improved", "confident", "anxious", "curious", "focused", "remembered",
    "forgot", "explained", "solved", "measured", "visual", "examples", "patience", "music", "chess", "drawing",
    "library", "notebook", "diagram", "timeline",
)
SEED_MEMORIES = 50
REQUEST_TIMEOUT = 60.0
LIVE_PAGES = 20


@dataclass
class Agent:
    index: int
    stack: str
    secret: str
    since: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    # What its kernle pushes and pulls send: the access token from its login, as kernle's client
    # does (`log_in`); its key until then. The native API's calls send the key.
    sync_headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Its own address behind the trusted proxy: 10.<high>.<low>.1 (per-address limits are per agent).
        self.headers = {"Authorization": f"Bearer {self.secret}",
                        "X-Forwarded-For": f"10.{self.index // 250}.{self.index % 250}.1"}
        self.sync_headers = self.headers

    async def log_in(self, http: AgentClient) -> None:
        """`POST /auth/login` with its key, as `kernle auth login` does; its syncs then send the token."""
        response = await http.post("/auth/login", headers=self.headers)
        response.raise_for_status()
        self.sync_headers = {**self.headers, "Authorization": f"Bearer {response.json()['token']}"}


@dataclass
class Sample:
    op: str
    started: float  # scheduled start (open loop) or send time (closed loop)
    ms: float
    status: int  # 0: no answer (timeout / connection error)
    error: str = ""
    late_ms: float = 0.0  # how late this load generator started it (its own event loop's lag)
    # The service's own account of it, from its Server-Timing header: (app, cpu, db) milliseconds.
    served: tuple[float, float, float] | None = None
    retry_after: bool = False  # the answer carried a readable Retry-After (`retry_after`)


class Recorder:
    def __init__(self) -> None:
        self.samples: list[Sample] = []
        self.acknowledged: list[str] = []  # record ids of writes the service acknowledged
        self.loop_lag_ms: list[float] = []  # the load generator's event-loop lag, sampled every 50 ms
        self.page_messages = 0  # messages the live pages of a closed loop received
        self.pages_closed_early: list[str] = []
        # When the load generator closed its connections at the end (monotonic): a request still
        # waiting then was cut off by it, not left unanswered by the service.
        self.closed_at = float("inf")

    def cut_off(self, sample: Sample) -> bool:
        return sample.status == 0 and sample.started + sample.ms / 1000 >= self.closed_at

    def by_op(self, since: float = 0.0) -> dict[str, list[Sample]]:
        grouped: dict[str, list[Sample]] = defaultdict(list)
        for sample in self.samples:
            if sample.started >= since:
                grouped[sample.op].append(sample)
        return grouped


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 18)))


def kernle_ops(rng: random.Random, stack: str, count: int) -> list[dict[str, Any]]:
    stamp = datetime.now(UTC).isoformat()
    ops = []
    for _ in range(count):
        rid = str(uuid.uuid4())
        ops.append({"operation": "update", "table": "notes", "record_id": rid, "local_updated_at": stamp,
                    "version": 1, "data": {"id": rid, "stack_id": stack, "content": sentence(rng),
                                           "note_type": "note", "tags": [rng.choice(WORDS)], "created_at": stamp,
                                           "local_updated_at": stamp, "version": 1, "deleted": False}})
    return ops


_SERVER_TIMING = re.compile(r"app;dur=([\d.]+), cpu;dur=([\d.]+), db;dur=([\d.]+)")


def server_timing(header: str) -> tuple[float, float, float] | None:
    """(app, cpu, db) milliseconds from the service's Server-Timing header (memoryhub.timing)."""
    match = _SERVER_TIMING.match(header)
    return None if match is None else (float(match[1]), float(match[2]), float(match[3]))


def retry_after(response: Answer) -> float | None:
    """The seconds a 503 / 429 asks the client to wait, or None when it carries no readable Retry-After."""
    value = response.headers.get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


async def operate(http: AgentClient, agent: Agent, op: str, rng: random.Random, recorder: Recorder,
                  scheduled: float, *, push_ops: int | None = None, mix: Mix = MIX) -> None:
    """One operation of `agent`; its latency is counted from `scheduled`."""
    acked: list[str] = []
    late_ms = (time.monotonic() - scheduled) * 1000
    base = f"/api/v1/stacks/{agent.stack}"
    cancelled: asyncio.CancelledError | None = None
    try:
        if op == "push":
            ops = kernle_ops(rng, agent.stack, push_ops or mix.push_size(rng))
            body = json.dumps({"stack_id": agent.stack, "operations": ops}).encode()
            # Counted apart from the interactive pushes: the service runs it in the bulk lane.
            op = "push" if len(body) < BULK_PUSH_BYTES else BULK_PUSH
            response = await http.post("/sync/push", content=body,
                                       headers={**agent.sync_headers, "Content-Type": "application/json"})
            if response.status_code == 200 and not response.json().get("conflicts"):
                acked = [o["record_id"] for o in ops]
        elif op == "pull":
            response = await http.post("/sync/pull", json={"stack_id": agent.stack, "since": agent.since},
                                       headers=agent.sync_headers)
            if response.status_code == 200:
                agent.since = response.json().get("server_time", agent.since)
        elif op == "search":
            response = await http.post(f"{base}/search", json={"query": " ".join(rng.sample(WORDS, 2)), "limit": 10},
                                       headers=agent.headers)
        elif op == "load":
            response = await http.get(f"{base}/load", headers=agent.headers)
        else:
            response = await http.post(f"{base}/memories", json={"kind": "note", "content": sentence(rng)},
                                       headers=agent.headers)
            if response.status_code == 201:
                acked = [str(response.json()["id"])]
        status, error = response.status_code, ("" if response.status_code < 400 else response.text[:160])
        served = server_timing(response.headers.get("server-timing", ""))
        says_when = retry_after(response) is not None
    except NO_ANSWER as exc:
        status, error, served, says_when = 0, type(exc).__name__, None, False
    except asyncio.CancelledError as exc:
        # The soak's end cut it off while it still waited (`soak`): a sample all the same, then cancelled.
        status, error, served, says_when, cancelled = 0, "cut off", None, False, exc
    recorder.samples.append(Sample(op, scheduled, (time.monotonic() - scheduled) * 1000, status, error, late_ms,
                                   served, says_when))
    recorder.acknowledged.extend(acked)
    if cancelled is not None:
        raise cancelled


# What a request that got no answer raises: refused, reset or closed connections, timeouts.
NO_ANSWER = (aiohttp.ClientError, asyncio.TimeoutError)


@dataclass(frozen=True)
class Answer:
    """A response, its body read whole."""

    status_code: int
    headers: Mapping[str, str]  # case-insensitive
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise RuntimeError(f"HTTP {self.status_code}: {self.text[:200]}")


class AgentClient:
    """An agent's HTTP client: at most `connections` kept-alive connections, requests past them queued
    in it (no bound on that wait: an agent's operations queue in its own client), 60 s to connect and
    between reads. aiohttp, whose HTTP parser is C: with httpx, once the service fell behind, the
    load generator's own pool bookkeeping and pure-Python parsing took cores the service then
    lacked on the machine they share (docs/benchmarks.md "Soak")."""

    def __init__(self, base_url: str, connections: int) -> None:
        self._session = aiohttp.ClientSession(
            base_url=base_url, connector=aiohttp.TCPConnector(limit=connections),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=REQUEST_TIMEOUT, sock_read=REQUEST_TIMEOUT))

    async def __aenter__(self) -> AgentClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._session.close()

    async def request(self, method: str, path: str, *, headers: Mapping[str, str] | None = None,
                      content: bytes | None = None, json: Any = None) -> Answer:
        async with self._session.request(method, path, headers=headers, data=content, json=json) as response:
            return Answer(response.status, response.headers, await response.read())

    async def get(self, path: str, *, headers: Mapping[str, str] | None = None) -> Answer:
        return await self.request("GET", path, headers=headers)

    async def post(self, path: str, *, headers: Mapping[str, str] | None = None, content: bytes | None = None,
                   json: Any = None) -> Answer:
        return await self.request("POST", path, headers=headers, content=content, json=json)


async def seed_and_baseline(base_url: str, agents: list[Agent], samples: int,
                            settle: Callable[[], None] | None = None) -> tuple[Recorder, Recorder]:
    """Log every agent in, seed every stack, call `settle` (it may block: nothing else runs then),
    warm up, then each operation alone, one at a time: the unloaded baseline."""
    rng = random.Random(7)
    seeding, baseline = Recorder(), Recorder()
    async with AgentClient(base_url, 16) as http:
        gate = asyncio.Semaphore(8)

        async def seed(agent: Agent) -> None:
            async with gate:
                await agent.log_in(http)
                await operate(http, agent, "push", rng, seeding, time.monotonic(), push_ops=SEED_MEMORIES)

        await asyncio.gather(*(seed(a) for a in agents))
        if settle is not None:
            settle()
        await unloaded(http, agents, samples, rng, baseline)
    return seeding, baseline


async def unloaded(http: AgentClient, agents: list[Agent], samples: int, rng: random.Random,
                   recorder: Recorder) -> None:
    """Each operation alone, one at a time, after a warm-up (the first calls import and connect)."""
    for op in MIX.weights:
        for agent in agents[:3]:
            await operate(http, agent, op, rng, Recorder(), time.monotonic())
    for n in range(samples):
        for k, op in enumerate(MIX.weights):
            agent = agents[(n * len(MIX.weights) + k) % len(agents)]
            await operate(http, agent, op, rng, recorder, time.monotonic())


class LivePage:
    """A student page's websocket: signed in as the school's admin, counting the change events it gets."""

    def __init__(self, url: str, origin: str, cookie: str) -> None:
        self.url, self.origin, self.cookie = url, origin, cookie
        self.events = 0
        self.closed_early = ""

    async def run(self, stop: asyncio.Event) -> None:
        from websockets.asyncio.client import connect
        from websockets.typing import Origin

        try:
            async with connect(self.url, origin=Origin(self.origin), additional_headers={"Cookie": self.cookie},
                               open_timeout=30) as socket:
                while not stop.is_set():
                    try:
                        await asyncio.wait_for(socket.recv(), timeout=0.5)
                    except TimeoutError:
                        continue
                    self.events += 1
        except Exception as exc:  # reported, not raised: one page's failure is a figure of the run
            self.closed_early = f"{type(exc).__name__}: {exc}"[:160]


async def soak(service: RunnerService, agents: list[Agent], cookie: str, seconds: float,
               on_half: Any) -> tuple[Recorder, list[LivePage], float]:
    """Every agent open loop for `seconds`; `on_half()` runs once half-way (RSS, backlog)."""
    recorder = Recorder()
    stop = asyncio.Event()
    ws_base = service.base_url.replace("http://", "ws://")
    pages = [LivePage(f"{ws_base}/ws/stacks/{agents[n % len(agents)].stack}/", service.base_url, cookie)
             for n in range(LIVE_PAGES)]
    page_tasks = [asyncio.create_task(page.run(stop)) for page in pages]
    in_flight: set[asyncio.Task[None]] = set()
    loop = asyncio.get_running_loop()

    # One HTTP client per agent, as real agents have: one client pooling 4 connections per agent
    # spent the load generator's whole core on the pool's bookkeeping once the server fell behind.
    async with contextlib.AsyncExitStack() as clients:
        # Made before the clock starts: a hundred clients made on the clock held every first
        # arrival back, then sent them, and each agent's operations due meanwhile, in one burst.
        https = [await clients.enter_async_context(AgentClient(service.base_url, 4)) for _ in agents]
        started = loop.time()
        deadline = started + seconds

        async def agent_loop(agent: Agent) -> None:
            http = https[agent.index]
            rng = random.Random(agent.index)
            at = started + rng.uniform(0, 2)  # spread the first arrivals
            while at < deadline:
                await asyncio.sleep(max(0.0, at - loop.time()))
                # Open loop: start the operation and schedule the next one, whatever this one takes.
                scheduled = time.monotonic() - (loop.time() - at)
                task = asyncio.create_task(operate(http, agent, MIX.pick_op(rng), rng, recorder, scheduled))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
                at += rng.uniform(1.0, 2.0)

        async def half_way() -> None:
            await asyncio.sleep(seconds / 2)
            await asyncio.to_thread(on_half)

        async def watch_lag() -> None:
            # How late this process's own event loop wakes: time it adds to every figure above,
            # none of it the service's (it shares the machine's cores with the service).
            while loop.time() < deadline:
                asked = loop.time()
                await asyncio.sleep(0.05)
                recorder.loop_lag_ms.append((loop.time() - asked - 0.05) * 1000)

        await asyncio.gather(*(agent_loop(a) for a in agents), half_way(), watch_lag())
        if in_flight:
            await asyncio.wait(in_flight, timeout=REQUEST_TIMEOUT + 5)
        recorder.closed_at = time.monotonic()
        cut_off = set(in_flight)
        for task in cut_off:
            task.cancel()  # each records its sample, counted as cut off (`operate`)
        if cut_off:
            await asyncio.wait(cut_off, timeout=10)
    elapsed = loop.time() - started
    await asyncio.sleep(1)  # the last writes' events reach the pages
    stop.set()
    await asyncio.gather(*page_tasks)
    return recorder, pages, elapsed


LOAD_GENERATOR_NICE = -5


@contextmanager
def ahead_of_the_service() -> Iterator[str]:
    """Run this load generator ahead of the service's processes while the cores are contended, so
    its own scheduling delays (an answer read late, an operation sent late) are not counted as the
    service's latency: agents run on machines of their own. Only root may; otherwise it says so.
    Both this process and its session's scheduling group (with autogroup every session is weighed
    alike, whatever its processes' niceness: docs/operations.md §8); the group's niceness is put
    back at the end, since the shell that started this shares the session."""
    before = session_group_nice("self")
    try:
        os.setpriority(os.PRIO_PROCESS, 0, LOAD_GENERATOR_NICE)
    except OSError:
        yield "at the service's priority (only root may raise it)"
        return
    set_session_group_nice("self", LOAD_GENERATOR_NICE)
    try:
        yield f"at nice {LOAD_GENERATOR_NICE}, ahead of the service's processes"
    finally:
        if before is not None:
            set_session_group_nice("self", before)


async def closed_loop(base_url: str, agents: list[Agent], clients: int, seconds: float,
                      mix: Mix = MIX, *, cookie: str = "", pages: int = 0) -> tuple[Recorder, float]:
    """`clients` clients, each sending its next operation when the last is answered. Each request is
    made as the next agent in turn (client n: agents n, n + clients, …), so the load is spread over
    every agent's own limits like real traffic, instead of one agent far over its 60 pushes/min.
    With `pages` (and the admin's session `cookie`), that many live student pages stay open
    meanwhile, on the agents' stacks in turn, as in the soak."""
    stop = asyncio.Event()
    ws_base = base_url.replace("http://", "ws://")
    live = [LivePage(f"{ws_base}/ws/stacks/{agents[n % len(agents)].stack}/", base_url, cookie) for n in range(pages)]
    page_tasks = [asyncio.create_task(page.run(stop)) for page in live]
    try:
        recorder, elapsed = await _closed_loop(base_url, agents, clients, seconds, mix)
    finally:
        stop.set()
        await asyncio.gather(*page_tasks)
    recorder.page_messages = sum(page.events for page in live)
    recorder.pages_closed_early = [page.closed_early for page in live if page.closed_early]
    return recorder, elapsed


async def _closed_loop(base_url: str, agents: list[Agent], clients: int, seconds: float,
                       mix: Mix) -> tuple[Recorder, float]:
    recorder = Recorder()
    async with AgentClient(base_url, clients * 2) as http:
        loop = asyncio.get_running_loop()
        started = loop.time()

        async def client(n: int) -> None:
            rng = random.Random(n * 7919 + clients)
            turn = n
            while loop.time() - started < seconds:
                await operate(http, agents[turn % len(agents)], mix.pick_op(rng), rng, recorder, time.monotonic(),
                              mix=mix)
                turn += clients

        await asyncio.gather(*(client(n) for n in range(clients)))
        return recorder, loop.time() - started


def bare_psycopg(database_url: str, stack_ids: list[int], clients: int, seconds: float,
                 mix: Mix = MIX) -> dict[str, Any]:
    """The core statement of each operation of the mix, closed loop from `clients` threads: a native
    write is one INSERT, a push an INSERT of its batch in one transaction, a pull the stack's changes
    of the last seconds, a load the stack's 200 strongest memories, a search a full-text match (the
    vector half left out). What the service adds on top (auth, limits, parsing, the write kernel's
    bookkeeping, JSON) is the difference to the HTTP figure."""
    import threading

    import psycopg

    columns = ("id, stack_id, kind, record_id, text, data, extra, tags, confidence, source_type, source_entity, "
               "derived_from, source_episodes, emotional_valence, emotional_arousal, emotional_tags, subject_ids, "
               "access_grants, consent_grants, strength, times_accessed, is_protected, version, client_version, "
               "created_at, server_updated_at, client_updated_at, size_bytes, stability, difficulty, "
               "forgotten_reason, embedding_model")
    insert = (f"INSERT INTO memories_memory ({columns}) VALUES (%s, %s, 'note', %s, %s, %s, '{{}}', %s, 0.8, '', '', "
              "'{}', '{}', 0, 0, '{}', '{}', '{}', '{}', 1.0, 0, false, 1, 1, now(), now(), now(), %s, 1.0, 5.0, "
              "'', '')")
    reads = {
        "pull": "SELECT id, kind, record_id, text, data, version, server_updated_at FROM memories_memory "
                "WHERE stack_id = %s AND server_updated_at > now() - interval '5 seconds' ORDER BY server_updated_at",
        "load": "SELECT id, kind, text, data, strength FROM memories_memory WHERE stack_id = %s "
                "AND deleted_at IS NULL ORDER BY strength DESC, created_at DESC LIMIT 200",
        "search": "SELECT id, text FROM memories_memory WHERE stack_id = %s AND deleted_at IS NULL "
                  "AND search_vector @@ plainto_tsquery('english', %s) LIMIT 10",
    }
    counts: Counter[str] = Counter()
    deadline = time.monotonic() + seconds

    def client(n: int) -> None:
        rng = random.Random(n)
        stack = stack_ids[n % len(stack_ids)]
        with psycopg.connect(database_url, autocommit=True) as conn:
            while time.monotonic() < deadline:
                op = mix.pick_op(rng)
                if op in ("write", "push"):
                    texts = [sentence(rng) for _ in range(1 if op == "write" else mix.push_size(rng))]
                    with conn.transaction(), conn.cursor() as cursor:
                        cursor.executemany(insert, [(uuid.uuid4(), stack, f"bare-{uuid.uuid4()}", text,
                                                     json.dumps({"content": text}), [rng.choice(WORDS)], len(text))
                                                    for text in texts])
                elif op == "search":
                    conn.execute(reads["search"], (stack, " ".join(rng.sample(WORDS, 2)))).fetchall()
                else:
                    conn.execute(reads[op], (stack,)).fetchall()
                counts[op] += 1

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 60)
    elapsed = time.monotonic() - started
    return {"per s": sum(counts.values()) / elapsed, "counts": dict(counts)}
