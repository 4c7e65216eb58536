"""Soak and saturation (issue 19): many agents at once against the whole service as `make run` runs it.

    .venv/bin/python bench/soak.py                         # 100 agents for 10 minutes
    .venv/bin/python bench/soak.py --minutes 2 --agents 50 # CI-sized
    .venv/bin/python bench/soak.py --saturate              # closed loop until throughput stops rising

One run starts the real runner (`python -m memoryhub.runner`: embedded Postgres and Redis, the web
server, one worker, beat) in a throw-away data dir on free ports, makes a school with one stack and
one stack-bound API key per agent, seeds every stack with 50 memories, then:

* **unloaded baseline**: each operation on its own, one at a time (after a warm-up), p50/p95 of
  100 samples each (`--baseline-samples`);
* **soak**: every agent at an agent's pace, *open loop*: an operation every 1-2 s (uniform),
  started on schedule whether or not its previous answer came, so a slow server meets the same
  arrivals (latency is measured from the scheduled start). The mix, per operation:
  search 30 %, load 15 %, native write (`POST …/memories`) 20 %, kernle push 20 %, kernle pull 15 %:
  an agent reads its memory more often than it writes, and syncs in between. Push batches are
  mostly small: 80 % of 1-5 operations, 17 % of 6-50, 3 % of 51-500 (kernle's own batch limit);
* 20 open live student pages (websocket clients signed in as the school's admin on
  `ws/stacks/<stack>/`, on the stacks being written), counting the change events they receive;
* each agent has its own key and, through a trusted local proxy (`TRUSTED_PROXIES`), its own
  address, as agents behind a load balancer would: per-key and per-address limits apply to each;
* at the end: every acknowledged write is checked against the database (exactly once), the
  embedding backlog is read at the middle and the end, and `/metrics` is scraped before and after.

Reported: throughput and p50/p95/p99 per operation next to its unloaded p95 (and, for reading the
ratio, the unloaded p95 measured again after the soak on the stacks it grew), every non-2xx by
status, the RSS of each process at the start, the middle and the end, and the issue's goals with
PASS/FAIL: no response >= 500; nothing lost or duplicated; p95 of every operation <= 3x its unloaded
p95; no process's RSS growing > 20 % over the second half. Also, to read those figures by: the p95
of all operations in each tenth of the run, each operation's p95 timed from when it was actually
sent, how late this load generator's own event loop ran (it shares the cores: its lateness is in
every figure, none of it the service's), the cores each part used during the soak, and the cores
the load would need for the embedding to keep up (the worker's share scaled from the vectors it
stored to the memories the agents wrote): above the machine's, no setting can meet the goals.

`--saturate` instead doubles closed-loop clients (each sends its next request when the last is
answered) until 2xx/s rises by < 5 %, and prints the peak requests/s of the mix with the cores used
by the web server, the worker, PostgreSQL and Redis (CPU seconds per second, from /proc of their
processes and their children, through psutil), next to as many bare psycopg threads running each
operation's core statement (INSERTs for writes and pushes, a SELECT each for pull, load and search).
Each step also counts the memories written and the vectors stored a second: a peak the embedding
does not keep up with borrows from the backlog. `--mix probe` runs the mix of the issue's first
probe (pushes of 10 operations, pulls and searches 4:2:4), the one its 24.6 requests/s were measured
on; the default `agents` mix is the soak's, heavier (loads, native writes, pushes of up to 500).
`--web-workers` / `--concurrency` size the service for an A/B of WEB_WORKERS and CELERY_CONCURRENCY.

`--compare NAME=VALUE[,…]` is that A/B on a busy machine: two services side by side, the second
with those settings (or `--compare "" --compare-base DIR`: the first runs the code of checkout DIR),
loaded in turn (A, B, A, B, …, `--rounds` each, `--compare-clients` closed-loop clients) so both meet
the same background load; medians of requests/s and of the CPU milliseconds the web server and
PostgreSQL spent per request (a cost figure that background load moves much less).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import random
import re
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
if str(BASE_DIR) not in sys.path:
    sys.path.insert(0, str(BASE_DIR))

import httpx  # noqa: E402
import psutil  # noqa: E402

from bench.harness import log, percentiles, print_table  # noqa: E402
from bench.service import RunnerService, runner_service  # noqa: E402
from memoryhub.embedded import session_group_nice, set_session_group_nice  # noqa: E402
from memoryhub.worker_priority import AWAITING_VECTORS  # noqa: E402


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
    # The probe that measured 24.6 requests/s: pushes of 10 operations, pulls and searches 4:2:4.
    "probe": Mix({"push": 40, "pull": 20, "search": 40}, ((100, 10, 10),)),
}
MIX = MIXES["agents"]
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

# --- the service ---------------------------------------------------------------------------------------------

@contextmanager
def running_service(workdir: Path, embedder: str, extra_env: dict[str, str],
                    code_dir: Path = BASE_DIR) -> Iterator[RunnerService]:
    """The real runner in `workdir`, on free ports (bench/service.py); stopped (everything it started) on exit."""
    extra = {"EMBEDDING_PROVIDER": embedder, "TRUSTED_PROXIES": "127.0.0.1/32", "LOG_LEVEL": "WARNING", **extra_env}
    with runner_service(workdir / "var", workdir / "runner.log", extra_env=extra, code_dir=code_dir) as service:
        yield service


def service_processes(runner_pid: int) -> dict[str, list[psutil.Process]]:
    """The runner's children by role, each with the processes it started (prefork children, backends)."""
    roles: dict[str, list[psutil.Process]] = {}
    for child in psutil.Process(runner_pid).children():
        cmd = " ".join(child.cmdline())
        if "uvicorn" in cmd:
            role = "web"
        elif "celery" in cmd and " worker " in cmd:
            role = "worker"
        elif "celery" in cmd and " beat " in cmd:
            role = "beat"
        elif cmd.split(" ", 1)[0].endswith("/postgres"):
            role = "postgres"
        elif "redis-server" in cmd:
            role = "redis"
        else:
            continue
        roles[role] = [child, *child.children(recursive=True)]
    return roles


def rss_snapshot(runner_pid: int) -> dict[str, float]:
    """MB per long-lived process; PostgreSQL's backends (they come and go with the pools) as one sum."""
    sizes: dict[str, float] = {}
    for role, procs in service_processes(runner_pid).items():
        for n, proc in enumerate(procs):
            try:
                rss = proc.memory_info().rss / 2**20
            except psutil.Error:
                continue
            if role == "postgres" and n > 0:
                sizes["postgres backends (sum)"] = sizes.get("postgres backends (sum)", 0.0) + rss
            else:
                sizes[role if n == 0 else f"{role} child {n}"] = rss
    return sizes


def cpu_seconds(runner_pid: int) -> dict[str, float]:
    """user+system CPU seconds so far per role, children included (from /proc through psutil)."""
    spent: dict[str, float] = {}
    for role, procs in service_processes(runner_pid).items():
        total = 0.0
        for proc in procs:
            try:
                times = proc.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
        spent[role] = total
    return spent


def scrape_metrics(base_url: str) -> dict[str, float]:
    """Totals of a few counters from /metrics (loopback needs no token)."""
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    totals: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        match = re.match(r"^(memoryhub_[a-z_]+?)(?:_total)?(?:\{[^}]*\})? ([0-9.e+-]+)$", line)
        if match and not line.startswith(("memoryhub_http_request_duration", "memoryhub_search_duration",
                                          "memoryhub_job_duration")):
            totals[match.group(1)] += float(match.group(2))
    return dict(totals)


def backlog(database_url: str) -> int:
    import psycopg

    with psycopg.connect(database_url) as conn:
        row = conn.execute(f"SELECT count(*) {AWAITING_VECTORS}").fetchone()
    return int(row[0]) if row else 0


# --- the agents ----------------------------------------------------------------------------------------------

@dataclass
class Agent:
    index: int
    stack: str
    secret: str
    since: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Its own address behind the trusted proxy: 10.<high>.<low>.1 (per-address limits are per agent).
        self.headers = {"Authorization": f"Bearer {self.secret}",
                        "X-Forwarded-For": f"10.{self.index // 250}.{self.index % 250}.1"}


@dataclass
class Sample:
    op: str
    started: float  # scheduled start (open loop) or send time (closed loop)
    ms: float
    status: int  # 0: no answer (timeout / connection error)
    error: str = ""
    late_ms: float = 0.0  # how late this load generator started it (its own event loop's lag)


class Recorder:
    def __init__(self) -> None:
        self.samples: list[Sample] = []
        self.acknowledged: list[str] = []  # record ids of writes the service acknowledged
        self.loop_lag_ms: list[float] = []  # the load generator's event-loop lag, sampled every 50 ms

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


async def operate(http: httpx.AsyncClient, agent: Agent, op: str, rng: random.Random, recorder: Recorder,
                  scheduled: float, *, push_ops: int | None = None, mix: Mix = MIX) -> None:
    """One operation of `agent`; its latency is counted from `scheduled`."""
    acked: list[str] = []
    late_ms = (time.monotonic() - scheduled) * 1000
    base = f"/api/v1/stacks/{agent.stack}"
    try:
        if op == "push":
            ops = kernle_ops(rng, agent.stack, push_ops or mix.push_size(rng))
            response = await http.post("/sync/push", json={"stack_id": agent.stack, "operations": ops},
                                       headers=agent.headers)
            if response.status_code == 200 and not response.json().get("conflicts"):
                acked = [o["record_id"] for o in ops]
        elif op == "pull":
            response = await http.post("/sync/pull", json={"stack_id": agent.stack, "since": agent.since},
                                       headers=agent.headers)
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
    except httpx.HTTPError as exc:
        status, error = 0, type(exc).__name__
    recorder.samples.append(Sample(op, scheduled, (time.monotonic() - scheduled) * 1000, status, error, late_ms))
    recorder.acknowledged.extend(acked)


def async_client(base_url: str, connections: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=base_url, timeout=REQUEST_TIMEOUT,
                             limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections))


async def seed_and_baseline(base_url: str, agents: list[Agent], samples: int) -> tuple[Recorder, Recorder]:
    """Seed every stack, warm up, then each operation alone, one at a time: the unloaded baseline."""
    rng = random.Random(7)
    seeding, baseline = Recorder(), Recorder()
    async with async_client(base_url, 16) as http:
        gate = asyncio.Semaphore(8)

        async def seed(agent: Agent) -> None:
            async with gate:
                await operate(http, agent, "push", rng, seeding, time.monotonic(), push_ops=SEED_MEMORIES)

        await asyncio.gather(*(seed(a) for a in agents))
        await unloaded(http, agents, samples, rng, baseline)
    return seeding, baseline


async def unloaded(http: httpx.AsyncClient, agents: list[Agent], samples: int, rng: random.Random,
                   recorder: Recorder) -> None:
    """Each operation alone, one at a time, after a warm-up (the first calls import and connect)."""
    for op in MIX.weights:
        for agent in agents[:3]:
            await operate(http, agent, op, rng, Recorder(), time.monotonic())
    for n in range(samples):
        for k, op in enumerate(MIX.weights):
            agent = agents[(n * len(MIX.weights) + k) % len(agents)]
            await operate(http, agent, op, rng, recorder, time.monotonic())


async def unloaded_again(base_url: str, database_url: str, agents: list[Agent], samples: int,
                         settle_seconds: float = 180.0) -> Recorder:
    """The unloaded baseline once more after the soak, on the stacks as the soak grew them (~13 times
    the seeded size after 10 minutes), once the embedding backlog has drained (or `settle_seconds`
    passed): how much of the loaded p95 is the data's growth rather than the load. Informational:
    the goal compares with the start, as the issue asks."""
    deadline = time.monotonic() + settle_seconds
    while backlog(database_url) > 0 and time.monotonic() < deadline:
        await asyncio.sleep(2)
    recorder = Recorder()
    async with async_client(base_url, 4) as http:
        await unloaded(http, agents, samples, random.Random(11), recorder)
    return recorder


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

    # One HTTP client per agent, as real agents have: a single client pooling 4 connections per agent
    # spent the load generator's whole core in httpx's pool bookkeeping (each queued request scans
    # every pooled connection) once the server fell behind, and then measured itself.
    async with contextlib.AsyncExitStack() as clients:
        # Made before the clock starts: a client builds its TLS context (~27 ms of CPU, even for
        # http://), and 100 of them made on the clock held every first arrival back ~2.7 s, then
        # sent them, and each agent's operations that fell due meanwhile, in one burst.
        https = [await clients.enter_async_context(async_client(service.base_url, 4)) for _ in agents]
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
    elapsed = loop.time() - started
    await asyncio.sleep(1)  # the last writes' events reach the pages
    stop.set()
    await asyncio.gather(*page_tasks)
    return recorder, pages, elapsed


def cores_used(before: dict[str, float], after: dict[str, float], own_before: Any, own_after: Any,
               elapsed: float) -> dict[str, float]:
    """CPU seconds per second of each role over a stretch, and of this load generator itself (it
    shares the machine: cores it burns are cores the service does not get)."""
    used = {role: (after[role] - before.get(role, 0.0)) / elapsed for role in sorted(after)}
    used["load generator"] = (own_after.user + own_after.system - own_before.user - own_before.system) / elapsed
    return used


def capacity_line(cores: dict[str, float], written_per_s: float, stored_per_s: float) -> str:
    """The cores this load would need for the embedding to keep up: what the service used, with the
    worker's share scaled from the vectors it stored to the memories the agents wrote
    (docs/production.md §3). Over the machine's cores, no setting makes the goals hold: the machine is too small."""
    if stored_per_s <= 0:
        return "CPU this load needs: unknown (no vector stored during the soak)"
    per_vector = cores.get("worker", 0.0) / stored_per_s
    service = {role: used for role, used in cores.items() if role not in ("worker", "load generator")}
    needed = sum(service.values()) + written_per_s * per_vector
    return (f"CPU this load needs for the embedding to keep up (cores, of {psutil.cpu_count()}): "
            + " + ".join(f"{role} {used:.2f}" for role, used in service.items() if used >= 0.005)
            + f" + embedding {written_per_s:.0f} memories/s x {1000 * per_vector:.1f} ms = {needed:.2f}"
            f" (and this load generator's {cores.get('load generator', 0.0):.2f})")


def stored_counts(database_url: str, record_ids: list[str]) -> Counter[str]:
    import psycopg

    counts: Counter[str] = Counter()
    with psycopg.connect(database_url) as conn:
        for start in range(0, len(record_ids), 10_000):
            chunk = record_ids[start:start + 10_000]
            # A join with the ids, not `record_id = ANY(%s)`: record_id is indexed only behind
            # stack_id, and ANY over 10,000 ids compared every row with every id (minutes a chunk
            # after a 10-minute soak); the join hashes the ids once.
            counts.update(rid for (rid,) in conn.execute(
                "SELECT m.record_id FROM memories_memory m"
                " JOIN (SELECT DISTINCT id FROM unnest(%s::text[]) AS ids(id)) acked ON m.record_id = acked.id",
                [chunk]))
    return counts


def report_soak(args: argparse.Namespace, recorder: Recorder, baseline: Recorder, pages: list[LivePage],
                elapsed: float, rss: dict[str, dict[str, float]], backlogs: dict[str, int],
                metrics: dict[str, dict[str, float]], stored: Counter[str], after: Recorder) -> bool:
    loaded, quiet, quiet_after = recorder.by_op(), baseline.by_op(), after.by_op()

    def ok_ms(samples: list[Any]) -> list[float]:
        return [s.ms for s in samples if 200 <= s.status < 300]

    rows, goals = [], []
    for op in MIX.weights:
        samples = loaded.get(op, [])
        ok = ok_ms(samples)
        figures, start, end = percentiles(ok), percentiles(ok_ms(quiet.get(op, []))), percentiles(
            ok_ms(quiet_after.get(op, [])))
        rows.append({"operation": op, "requests": len(samples), "per s": len(samples) / elapsed,
                     "2xx": len(ok), "p50 ms": figures["p50"], "p95 ms": figures["p95"], "p99 ms": figures["p99"],
                     "unloaded p50": start["p50"], "unloaded p95": start["p95"],
                     "p95 / unloaded": figures["p95"] / start["p95"] if start["n"] else float("nan"),
                     "unloaded p95, grown stacks": end["p95"] if end["n"] else float("nan"),
                     # the same answers timed from when this process actually sent them
                     "p95 from send": percentiles([s.ms - s.late_ms for s in samples if 200 <= s.status < 300])["p95"]})
        goals.append((f"{op}: p95 {figures['p95']:.0f} ms <= 3x unloaded p95 {start['p95']:.0f} ms",
                      figures["p95"] <= 3 * start["p95"]))
    total = len(recorder.samples)
    print_table(f"soak: {args.agents} agents, {elapsed:.0f} s, open loop (an operation every 1-2 s each); "
                f"{total:,} requests = {total / elapsed:.1f}/s", rows)
    # Latency over the run, in tenths: a slow start (the seed's embedding backlog) or a worsening
    # (the stacks grow) shows here, not in the run's one p95.
    started = min((s.started for s in recorder.samples), default=0.0)
    tenths: dict[int, list[float]] = defaultdict(list)
    for sample in recorder.samples:
        if 200 <= sample.status < 300:
            tenths[min(9, int(10 * (sample.started - started) / elapsed))].append(sample.ms)
    print("\np95 of all operations by tenth of the run (ms): "
          + ", ".join(f"{percentiles(tenths[n])['p95']:.0f}" for n in range(10)))
    lag, late = percentiles(recorder.loop_lag_ms), percentiles([s.late_ms for s in recorder.samples])
    print(f"\nload generator (one process on the same cores): event-loop lag p50 {lag['p50']:.1f} / p95 "
          f"{lag['p95']:.1f} / p99 {lag['p99']:.1f} ms; operations started late by p50 {late['p50']:.1f} / p95 "
          f"{late['p95']:.1f} ms (counted in the figures above: latency runs from the scheduled start)")
    statuses = Counter(s.status for s in recorder.samples if not 200 <= s.status < 300)
    print("\nnon-2xx by status (0 = no answer): "
          + (", ".join(f"{status}: {n}" for status, n in sorted(statuses.items())) or "none"))
    for status in sorted(statuses):
        example = next(s for s in recorder.samples if s.status == status)
        print(f"  e.g. {status} on {example.op}: {example.error}")
    print_table("RSS per process (MB)", [{"process": name, "start": rss["start"].get(name, float("nan")),
                                          "middle": rss["middle"].get(name, float("nan")),
                                          "end": rss["end"].get(name, float("nan"))} for name in rss["end"]])
    print(f"\nembedding backlog: start {backlogs['start']:,}, middle {backlogs['middle']:,}, end {backlogs['end']:,}; "
          f"lag at the end (/metrics: the oldest change still awaiting a vector) "
          f"{metrics['end'].get('memoryhub_embedding_lag_seconds', 0.0):,.0f} s")
    print(f"live pages: {sum(p.events for p in pages):,} change events received by {len(pages)} pages; "
          f"closed early: {sum(bool(p.closed_early) for p in pages)} "
          f"{next((p.closed_early for p in pages if p.closed_early), '')}")
    moved = {name: metrics["end"].get(name, 0.0) - metrics["start"].get(name, 0.0) for name in sorted(metrics["end"])}
    print("/metrics counters moved during the soak: "
          + ", ".join(f"{name.removeprefix('memoryhub_')} +{value:,.0f}" for name, value in moved.items() if value))

    acknowledged = recorder.acknowledged
    lost = sum(1 for rid in acknowledged if stored[rid] == 0)
    duplicated = sum(1 for rid in acknowledged if stored[rid] > 1) + (len(acknowledged) - len(set(acknowledged)))
    server_errors = sum(1 for s in recorder.samples if s.status >= 500)
    grown = {name: rss["end"][name] / rss["middle"][name] - 1 for name in rss["end"]
             if name in rss["middle"] and not name.startswith("postgres backends") and rss["middle"][name] > 0}
    worst = max(grown.items(), key=lambda item: item[1]) if grown else ("-", 0.0)
    goals = [(f"responses >= 500: {server_errors}", server_errors == 0),
             (f"acknowledged writes {len(acknowledged):,}: lost {lost}, duplicated {duplicated}",
              lost == 0 and duplicated == 0),
             *goals,
             (f"RSS growth over the second half: worst {worst[0]} {worst[1]:+.1%}", worst[1] <= 0.20),
             (f"embedding backlog not growing over the second half ({backlogs['middle']:,} -> {backlogs['end']:,})",
              backlogs["end"] <= max(backlogs["middle"], 100))]
    print("\nGoals (issue 19):")
    for text, passed in goals:
        print(f"  {'PASS' if passed else 'FAIL'}  {text}")
    return all(passed for _, passed in goals)


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


def run_soak(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="memoryhub-soak-"))
    log(f"starting the service (runner) in {workdir}; embedder {args.embedder}")
    extra = {"WEB_WORKERS": str(args.web_workers)} if args.web_workers else {}
    if args.concurrency:
        extra["CELERY_CONCURRENCY"] = str(args.concurrency)
    try:
        with running_service(workdir, args.embedder, extra) as service:
            school = service.make_school("soak", args.agents)
            agents = [Agent(n, a["stack"], a["secret"]) for n, a in enumerate(school["agents"])]
            log(f"seeding {args.agents} stacks with {SEED_MEMORIES} memories each, then the unloaded baseline")
            seeding, baseline = asyncio.run(seed_and_baseline(service.base_url, agents, args.baseline_samples))
            rss = {"start": rss_snapshot(service.runner.pid)}
            backlogs = {"start": backlog(service.database_url)}
            metrics = {"start": scrape_metrics(service.base_url)}

            def half() -> None:
                rss["middle"] = rss_snapshot(service.runner.pid)
                backlogs["middle"] = backlog(service.database_url)

            log(f"soak: {args.agents} agents for {args.minutes:g} min (at {time.time():.1f})")
            # This load generator's own collector pauses would count as the service's latency: what
            # it holds from the seed is frozen out of them (as the service does, memoryhub/interpreter.py,
            # but whatever the service's PYTHON_GC_TUNING: an A/B of it changes the service only).
            gc.collect()
            gc.freeze()
            cpu_before, own_before = cpu_seconds(service.runner.pid), psutil.Process().cpu_times()
            with ahead_of_the_service() as priority:
                log(f"load generator {priority}")
                recorder, pages, elapsed = asyncio.run(soak(service, agents, school["cookie"], args.minutes * 60,
                                                            half))
            cores = cores_used(cpu_before, cpu_seconds(service.runner.pid), own_before, psutil.Process().cpu_times(),
                               elapsed)
            rss["end"] = rss_snapshot(service.runner.pid)
            backlogs["end"] = backlog(service.database_url)
            metrics["end"] = scrape_metrics(service.base_url)
            stored = stored_counts(service.database_url, recorder.acknowledged + seeding.acknowledged)
            log("the unloaded baseline again, on the grown stacks, once the embedding backlog has drained")
            after = asyncio.run(unloaded_again(service.base_url, service.database_url, agents, args.baseline_samples))
            recorder_ok = report_soak(args, recorder, baseline, pages, elapsed, rss, backlogs, metrics, stored,
                                      after)
            print(f"\nCPU during the soak (cores, of {psutil.cpu_count()}): "
                  + ", ".join(f"{role} {used:.2f}" for role, used in cores.items()))
            print(capacity_line(cores, len(recorder.acknowledged) / elapsed,
                                (metrics["end"].get("memoryhub_embeddings_stored", 0.0)
                                 - metrics["start"].get("memoryhub_embeddings_stored", 0.0)) / elapsed))
            # The worker yields to requests while embedding keeps up (memoryhub/worker_priority.py):
            # the switches it made, from the runner's own log.
            switches = [line.split("] ", 1)[-1] for line in service.log_path.read_text(errors="replace").splitlines()
                        if "embedding is over" in line or "embedding caught up" in line]
            print(f"worker priority switches: {len(switches)}" + "".join(f"\n  {line}" for line in switches[:6]))
            lost_seed = sum(1 for rid in seeding.acknowledged if stored[rid] != 1)
            print(f"seed writes: {len(seeding.acknowledged):,} acknowledged, {lost_seed} not stored exactly once")
            return 0 if recorder_ok and lost_seed == 0 else 1
    finally:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)


# --- saturation ----------------------------------------------------------------------------------------------

async def closed_loop(base_url: str, agents: list[Agent], clients: int, seconds: float,
                      mix: Mix = MIX) -> tuple[Recorder, float]:
    """`clients` clients, each sending its next operation when the last is answered. Each request is
    made as the next agent in turn (client n: agents n, n + clients, …), so the load is spread over
    every agent's own limits like real traffic, instead of one agent far over its 60 pushes/min."""
    recorder = Recorder()
    async with async_client(base_url, clients * 2) as http:
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


def run_saturate(args: argparse.Namespace) -> int:
    import psycopg

    workdir = Path(tempfile.mkdtemp(prefix="memoryhub-saturate-"))
    extra = {"WEB_WORKERS": str(args.web_workers)} if args.web_workers else {}
    if args.concurrency:
        extra["CELERY_CONCURRENCY"] = str(args.concurrency)
    mix = MIXES[args.mix]
    log(f"starting the service (runner) in {workdir}; embedder {args.embedder}; {extra or 'default sizing'}; "
        f"mix {args.mix}: {mix.weights}, {mix.memories_per_request():.1f} memories written a request")
    try:
        with running_service(workdir, args.embedder, extra) as service:
            school = service.make_school("soak", args.agents)
            agents = [Agent(n, a["stack"], a["secret"]) for n, a in enumerate(school["agents"])]
            asyncio.run(seed_and_baseline(service.base_url, agents, 1))
            rows, best, peak = [], 0.0, None
            clients = 2
            while clients <= args.agents:
                cpu_before, own_before = cpu_seconds(service.runner.pid), psutil.Process().cpu_times()
                embedded_before = scrape_metrics(service.base_url).get("memoryhub_embeddings_stored", 0.0)
                recorder, elapsed = asyncio.run(closed_loop(service.base_url, agents, clients, args.step_seconds,
                                                            mix))
                cpu_after, own_after = cpu_seconds(service.runner.pid), psutil.Process().cpu_times()
                embedded = scrape_metrics(service.base_url).get("memoryhub_embeddings_stored", 0.0) - embedded_before
                ok = [s for s in recorder.samples if 200 <= s.status < 300]
                rate = len(ok) / elapsed
                used = cores_used(cpu_before, cpu_after, own_before, own_after, elapsed)
                latency = percentiles([s.ms for s in ok])
                failed = Counter(s.status for s in recorder.samples if not 200 <= s.status < 300)
                row: dict[str, Any] = {"clients": clients, "2xx per s": rate,
                       "non-2xx": ", ".join(f"{n}x {status}" for status, n in sorted(failed.items())) or "0",
                       "p50 ms": latency["p50"], "p95 ms": latency["p95"],
                       # Writes acknowledged against vectors stored in the step: whether the
                       # embedding keeps up at this rate or the peak borrows from the backlog.
                       "memories in per s": len(recorder.acknowledged) / elapsed,
                       "vectors stored per s": embedded / elapsed,
                       "web cores": used.get("web", 0.0), "worker cores": used.get("worker", 0.0),
                       "postgres cores": used.get("postgres", 0.0), "redis cores": used.get("redis", 0.0),
                       "load client cores": used["load generator"]}
                rows.append(row)
                log(f"{clients} clients: {rate:.1f} req/s (2xx)")
                for status in sorted(failed):
                    example = next(s for s in recorder.samples if s.status == status)
                    log(f"  e.g. {status} on {example.op}: {example.error}")
                rising = rate > best * 1.05
                if peak is None or rate > peak["2xx per s"]:
                    peak = row
                best = max(best, rate)
                if not rising:
                    break
                clients *= 2
            print_table(f"saturation: closed-loop clients doubled until 2xx/s rose < 5 % (mix {args.mix}: "
                        f"{mix.weights}; {args.step_seconds:g} s per step; cores = CPU seconds per second)", rows)
            assert peak is not None
            with psycopg.connect(service.database_url) as conn:
                stack_ids = [pk for (pk,) in conn.execute(
                    "SELECT id FROM stacks_stack WHERE slug = ANY(%s) ORDER BY slug",
                    [[agent["stack"] for agent in school["agents"]]])]
            bare = bare_psycopg(service.database_url, stack_ids, int(peak["clients"]), args.step_seconds, mix)
            cores = {k: peak[k] for k in ("web cores", "worker cores", "postgres cores")}
            # The 24.6 requests/s was measured on the probe's mix; on another mix the goal is
            # only indicative.
            same = "on the same mix" if args.mix == "probe" else "measured on --mix probe, not this mix"
            print(f"\npeak: {peak['2xx per s']:.1f} requests/s with {peak['clients']} clients "
                  f"(issue 19 goal: >= 246, 10x the 24.6 {same}; "
                  f"{'PASS' if peak['2xx per s'] >= 246 else 'FAIL'}); CPU split at the peak: "
                  + ", ".join(f"{k} {v:.2f}" for k, v in cores.items())
                  + f"; memories written {peak['memories in per s']:.0f}/s, vectors stored "
                  f"{peak['vectors stored per s']:.0f}/s")
            print(f"bare psycopg, the mix's core statements, {peak['clients']} threads: {bare['per s']:.1f} ops/s "
                  f"({bare['counts']}); the service reaches {peak['2xx per s'] / bare['per s']:.2f}x of it")
            return 0
    finally:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)


def measure_round(service: RunnerService, agents: list[Agent], clients: int, seconds: float,
                  mix: Mix = MIX) -> dict[str, float]:
    """One closed-loop round: 2xx/s and the CPU milliseconds each role spent per 2xx request."""
    before = cpu_seconds(service.runner.pid)
    recorder, elapsed = asyncio.run(closed_loop(service.base_url, agents, clients, seconds, mix))
    after = cpu_seconds(service.runner.pid)
    ok = [s for s in recorder.samples if 200 <= s.status < 300]
    row: dict[str, float] = {"2xx per s": len(ok) / elapsed, "non-2xx": len(recorder.samples) - len(ok),
                             "p50 ms": percentiles([s.ms for s in ok])["p50"]}
    for role in ("web", "postgres", "worker"):
        row[f"{role} cpu ms/req"] = 1000 * (after.get(role, 0.0) - before.get(role, 0.0)) / max(len(ok), 1)
    return row


def run_compare(args: argparse.Namespace) -> int:
    """A/B on a noisy machine: two services side by side, A as configured and B with `--compare`'s
    settings, loaded in turn (A, B, A, B, …) so both meet the same background load; medians."""
    import shutil
    import statistics
    from contextlib import ExitStack

    override = dict(pair.split("=", 1) for pair in args.compare.split(",") if "=" in pair)
    base = {"WEB_WORKERS": str(args.web_workers)} if args.web_workers else {}
    if args.concurrency:
        base["CELERY_CONCURRENCY"] = str(args.concurrency)
    configs = {"A": base, "B": {**base, **override}}
    code_dirs = {"A": Path(args.compare_base).resolve() if args.compare_base else BASE_DIR, "B": BASE_DIR}
    workdirs = [Path(tempfile.mkdtemp(prefix=f"memoryhub-compare-{name}-")) for name in configs]
    try:
        with ExitStack() as stack:
            services, crowds = {}, {}
            for (name, extra), workdir in zip(configs.items(), workdirs, strict=True):
                log(f"starting service {name} ({extra or 'default sizing'}) from {code_dirs[name]} in {workdir}")
                services[name] = stack.enter_context(running_service(workdir, args.embedder, extra, code_dirs[name]))
                school = services[name].make_school("soak", args.agents)
                crowds[name] = [Agent(n, a["stack"], a["secret"]) for n, a in enumerate(school["agents"])]
                asyncio.run(seed_and_baseline(services[name].base_url, crowds[name], 1))
            rounds: dict[str, list[dict[str, float]]] = {name: [] for name in configs}
            for n in range(args.rounds):
                for name in configs:
                    rounds[name].append(measure_round(services[name], crowds[name], args.compare_clients,
                                                      args.step_seconds, MIXES[args.mix]))
                    log(f"round {n + 1} {name}: {rounds[name][-1]['2xx per s']:.1f} req/s")
            rows = []
            for name, extra in configs.items():
                origin = "" if code_dirs[name] == BASE_DIR else f" (code: {code_dirs[name]})"
                row: dict[str, Any] = {"service": f"{name} {extra or 'default'}{origin}"}
                for column in rounds[name][0]:
                    row[column] = statistics.median(r[column] for r in rounds[name])
                rows.append(row)
            print_table(f"compare: {args.rounds} alternating rounds of {args.step_seconds:g} s, "
                        f"{args.compare_clients} closed-loop clients each (medians)", rows)
            a, b = rows
            print(f"\nB / A: {b['2xx per s'] / a['2xx per s']:.2f}x requests/s; web CPU per request "
                  f"{b['web cpu ms/req'] / max(a['web cpu ms/req'], 1e-9):.2f}x, postgres CPU per request "
                  f"{b['postgres cpu ms/req'] / max(a['postgres cpu ms/req'], 1e-9):.2f}x")
        return 0
    finally:
        for workdir in workdirs:
            shutil.rmtree(workdir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=100, help="agents, each with its own stack and key")
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the soak")
    # A p95 needs samples: of 20 it is the second slowest, and whether one of the 3 % of pushes
    # carrying 51-500 operations is among them moved the push baseline between 25 and 40 ms from
    # one run to the next; of 100 it is a push of the mix's own 95th percentile.
    parser.add_argument("--baseline-samples", type=int, default=100, help="unloaded samples per operation")
    parser.add_argument("--embedder", default=os.environ.get("EMBEDDING_PROVIDER", "minilm"),
                        choices=["minilm", "hash"], help="EMBEDDING_PROVIDER of the service (default: the shipped one)")
    parser.add_argument("--web-workers", type=int, default=0, help="WEB_WORKERS (default: the runner's own)")
    parser.add_argument("--concurrency", type=int, default=0, help="CELERY_CONCURRENCY (default: the runner's own)")
    parser.add_argument("--saturate", action="store_true", help="closed loop, clients added until the peak")
    parser.add_argument("--mix", choices=sorted(MIXES), default="agents",
                        help="--saturate / --compare: the agents' mix (the soak's) or the issue's probe")
    parser.add_argument("--step-seconds", type=float, default=20.0, help="--saturate / --compare: seconds per step")
    parser.add_argument("--compare", default="", metavar="NAME=VALUE[,…]",
                        help="A/B: a second service with these settings, loaded in turn with the first")
    parser.add_argument("--compare-base", default="", metavar="DIR",
                        help="--compare: run service A from this other checkout (the code before a change)")
    parser.add_argument("--rounds", type=int, default=3, help="--compare: rounds per service")
    parser.add_argument("--compare-clients", type=int, default=4, help="--compare: closed-loop clients")
    args = parser.parse_args()
    if args.compare or args.compare_base:
        return run_compare(args)
    return run_saturate(args) if args.saturate else run_soak(args)


if __name__ == "__main__":
    sys.exit(main())
