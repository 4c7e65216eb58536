"""Soak and saturation: many agents at once against the whole service as `make run` runs it.

    .venv/bin/python bench/soak.py                         # 100 agents for 10 minutes
    .venv/bin/python bench/soak.py --minutes 2 --agents 50 # CI-sized
    .venv/bin/python bench/soak.py --saturate              # closed loop until throughput stops rising

One run starts the real runner (`python -m memoryhub.runner`: embedded Postgres and Redis, the web
server, one worker, beat) in a throw-away data dir on free ports, makes a school with one stack and
one stack-bound API key per agent, seeds every stack with 50 memories, waits for their vectors,
then:

* **unloaded baseline**: each operation on its own, one at a time (after a warm-up), p50/p95 of
  100 samples each (`--baseline-samples`), with no embedding backlog: the worker embedding the
  seed beside it would make the baseline slower, and every ratio to it kinder;
* **soak**: every agent at an agent's pace, *open loop*: an operation every 1-2 s (uniform),
  started on schedule whether or not its previous answer came, so a slow server meets the same
  arrivals (latency is measured from the scheduled start). The mix, per operation:
  search 30 %, load 15 %, native write (`POST …/memories`) 20 %, kernle push 20 %, kernle pull 15 %:
  an agent reads its memory more often than it writes, and syncs in between. Push batches are
  mostly small: 80 % of 1-5 operations, 17 % of 6-50, 3 % of 51-500 (kernle's own batch limit);
  those of 32 kB or more (about 70 operations) are the service's bulk lane, reported on a row of
  their own;
* 20 open live student pages (websocket clients signed in as the school's admin on
  `ws/stacks/<stack>/`, on the stacks being written), counting the change events they receive;
* each agent has its own key and, through a trusted local proxy (`TRUSTED_PROXIES`), its own
  address, as agents behind a load balancer would: per-key and per-address limits apply to each;
  it logs in first (`POST /auth/login`) and its kernle pushes and pulls send the access token, as
  kernle's client does; its native API calls send the key;
* at the end: every acknowledged write is checked against the database (exactly once), the
  embedding backlog is read at the middle and the end, `/metrics` is scraped before and after, and
  the soak waits for the backlog to drain, up to DRAIN_SECONDS or as long as the soak ran, if longer
  (a backlog the worker left while requests were slowed drains after the load).

Reported: throughput and p50/p95/p99 per operation next to its unloaded p95 (and, for reading the
ratio, the unloaded p95 measured again after the soak on the stacks it grew), every non-2xx by
status, the RSS of each process at the start, the middle and the end, and the goals with PASS/FAIL:
every request answered, and no 5xx but a 503 with Retry-After (bulk work deferred, which a real
client retries); nothing lost or duplicated; p95 of every operation <= 3x its unloaded p95 (the
bulk lane's pushes: reported, no goal); no process's RSS growing > 20 % over the second half; the
embedding backlog drained once the load ended (it may lag during it). Also, time to searchable
(write acknowledged -> vector stored) of the soak's writes, p50 and p95, and, to read those figures
by: where the slowest 5 % of each operation spent their time against its fastest half (the service's
`Server-Timing`: its CPU, its database statements, waiting inside it, and the rest outside it;
docs/operations.md §13), the p95 of all operations in each tenth of the run, each operation's p95
timed from when it was actually sent, how late this load generator's own event loop ran (it shares
the cores: its lateness is in every figure, none of it the service's), the cores each part used
during the soak, and the cores the load would need for the embedding to keep up (the worker's share
scaled from the vectors it stored to the memories the agents wrote): above the machine's, no setting
can meet the goals.

`--saturate` instead doubles closed-loop clients (each sends its next request when the last is
answered) until 2xx/s rises by < 5 %, and prints the peak requests/s of the mix with the cores used
by the web server, the worker, PostgreSQL and Redis (CPU seconds per second, from /proc of their
processes and their children, through psutil), next to as many bare psycopg threads running each
operation's core statement (INSERTs for writes and pushes, a SELECT each for pull, load and search).
Each step also counts the memories written and the vectors stored a second: a peak the embedding
does not keep up with borrows from the backlog. `--mix probe` runs the mix of the first probe
(pushes of 10 operations, pulls and searches 4:2:4), the one the peak's goal was set on (its first
figure on that mix: docs/benchmarks.md "Soak"); the default `agents` mix is the soak's, heavier
(loads, native writes, pushes of up to 500).
`--saturate --compare-base DIR` finds the peak of the code in checkout DIR with this load generator: run it
and the plain `--saturate` one after the other for a before/after.
`--costs` runs each operation of the mix alone, in turn (closed loop, `--compare-clients` clients,
`--rounds` rounds of `--step-seconds`), and prints what one request of each costs the web server
and PostgreSQL in CPU milliseconds, and the mix's weighted sum: where a core goes.
`--web-workers` / `--concurrency` size the service for an A/B of WEB_WORKERS and CELERY_CONCURRENCY.

`--compare NAME=VALUE[,…]` is that A/B on a busy machine: two services side by side, the second
with those settings (or `--compare "" --compare-base DIR`: the first runs the code of checkout DIR),
loaded in turn (A, B, A, B, …, `--rounds` each, `--compare-clients` closed-loop clients) so both meet
the same background load; medians of requests/s and of the CPU milliseconds the web server and
PostgreSQL spent per request (a cost figure that background load moves much less). `--compare-pages
N` keeps N live student pages open during each round, as the soak does (their renders are web CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
if str(BASE_DIR) not in sys.path:
    sys.path.insert(0, str(BASE_DIR))

import psutil  # noqa: E402

from bench.harness import Machine, log, percentiles, print_listed, print_table  # noqa: E402
from bench.service import RunnerService, runner_service  # noqa: E402
from bench.soak_agents import (  # noqa: E402
    MIX,
    MIXES,
    SEED_MEMORIES,
    Agent,
    AgentClient,
    Mix,
    Recorder,
    ahead_of_the_service,
    bare_psycopg,
    closed_loop,
    seed_and_baseline,
    soak,
    unloaded,
)
from bench.soak_report import (  # noqa: E402
    average_stack_size,
    backlog,
    capacity_line,
    cores_used,
    cpu_seconds,
    drain,
    print_growth_split,
    report_soak,
    rss_snapshot,
    scrape_metrics,
    searchable_buckets,
    stored_counts,
    vector_models,
)

# How long the soak waits, once the load has ended, for the embedding backlog to drain: the worker
# may fall behind under the load (it yields the cores to requests), but must catch up after it.
DRAIN_SECONDS = 300.0


@contextmanager
def running_service(workdir: Path, embedder: str, extra_env: dict[str, str],
                    code_dir: Path = BASE_DIR) -> Iterator[RunnerService]:
    """The real runner in `workdir`, on free ports (bench/service.py); stopped (everything it started) on exit."""
    extra = {"EMBEDDING_PROVIDER": embedder, "TRUSTED_PROXIES": "127.0.0.1/32", "LOG_LEVEL": "WARNING", **extra_env}
    with runner_service(workdir / "var", workdir / "runner.log", extra_env=extra, code_dir=code_dir) as service:
        yield service


async def unloaded_again(base_url: str, agents: list[Agent], samples: int) -> Recorder:
    """The unloaded baseline once more after the soak, on the stacks as the soak grew them (many
    times the seeded size after a long soak), once the embedding backlog has drained (`drain`): how
    much of the loaded p95 is the data's growth rather than the load. Informational: the goal
    compares with the start."""
    recorder = Recorder()
    async with AgentClient(base_url, 4) as http:
        await unloaded(http, agents, samples, random.Random(11), recorder)
    return recorder


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
            log(f"seeding {args.agents} stacks with {SEED_MEMORIES} memories each, then, once their vectors are "
                "stored, the unloaded baseline")

            def settle() -> None:
                took, left = drain(service.database_url, DRAIN_SECONDS)
                log(f"the seed's embedding backlog: {left:,} left after {took:.0f} s; its vectors' model: "
                    f"{vector_models(service.database_url)}")

            seeding, baseline = asyncio.run(seed_and_baseline(service.base_url, agents, args.baseline_samples,
                                                              settle=settle))
            rss = {"start": rss_snapshot(service.runner.pid)}
            backlogs = {"start": backlog(service.database_url)}
            metrics = {"start": scrape_metrics(service.base_url)}
            searchable = {"start": searchable_buckets(service.base_url)}

            def half() -> None:
                rss["middle"] = rss_snapshot(service.runner.pid)
                backlogs["middle"] = backlog(service.database_url)

            log(f"soak: {args.agents} agents for {args.minutes:g} min (at {time.time():.1f})")
            # This load generator's own collector pauses would count as the service's latency: what
            # it holds from the seed is frozen out of them (as the service does, memoryhub/interpreter.py,
            # but whatever the service's PYTHON_GC_TUNING: an A/B of it changes the service only).
            gc.collect()
            gc.freeze()
            machine = Machine()
            machine.start()
            cpu_before, own_before = cpu_seconds(service.runner.pid), psutil.Process().cpu_times()
            with ahead_of_the_service() as priority:
                log(f"load generator {priority}")
                recorder, pages, elapsed = asyncio.run(soak(service, agents, school["cookie"], args.minutes * 60,
                                                            half))
            machine.stop()
            cores = cores_used(cpu_before, cpu_seconds(service.runner.pid), own_before, psutil.Process().cpu_times(),
                               elapsed)
            rss["end"] = rss_snapshot(service.runner.pid)
            backlogs["end"] = backlog(service.database_url)
            metrics["end"] = scrape_metrics(service.base_url)
            stored = stored_counts(service.database_url, recorder.acknowledged + seeding.acknowledged)
            drain_limit = max(DRAIN_SECONDS, args.minutes * 60)
            log(f"waiting up to {drain_limit:.0f} s for the embedding backlog to drain")
            drained = drain(service.database_url, drain_limit)
            # After the drain: the vectors the load left behind are its writes' slowest.
            searchable["end"] = searchable_buckets(service.base_url)
            log("the unloaded baseline again, on the grown stacks")
            after = asyncio.run(unloaded_again(service.base_url, agents, args.baseline_samples))
            recorder_ok = report_soak(args, recorder, baseline, pages, elapsed, rss, backlogs, metrics, stored,
                                      after, searchable, drained)
            print_growth_split(baseline.by_op(), after.by_op(), SEED_MEMORIES, average_stack_size(service.database_url))
            print("\n" + machine.line())
            print(f"CPU during the soak (cores, of {psutil.cpu_count()}): "
                  + ", ".join(f"{role} {used:.2f}" for role, used in cores.items()))
            print(capacity_line(cores, len(recorder.acknowledged) / elapsed,
                                (metrics["end"].get("memoryhub_embeddings_stored", 0.0)
                                 - metrics["start"].get("memoryhub_embeddings_stored", 0.0)) / elapsed))
            print_listed("worker priority switches", service.worker_priority_switches(), 6)
            print_listed("web processes replaced by uvicorn's supervisor", service.web_processes_replaced(), 6)
            print_listed("errors the service logged", service.errors_logged(), 10)
            lost_seed = sum(1 for rid in seeding.acknowledged if stored[rid] != 1)
            print(f"seed writes: {len(seeding.acknowledged):,} acknowledged, {lost_seed} not stored exactly once")
            return 0 if recorder_ok and lost_seed == 0 else 1
    finally:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)


def run_saturate(args: argparse.Namespace) -> int:
    import psycopg

    workdir = Path(tempfile.mkdtemp(prefix="memoryhub-saturate-"))
    code_dir = Path(args.compare_base).resolve() if args.compare_base else BASE_DIR
    extra = {"WEB_WORKERS": str(args.web_workers)} if args.web_workers else {}
    if args.concurrency:
        extra["CELERY_CONCURRENCY"] = str(args.concurrency)
    mix = MIXES[args.mix]
    log(f"starting the service (runner) from {code_dir} in {workdir}; embedder {args.embedder}; "
        f"{extra or 'default sizing'}; mix {args.mix}: {mix.weights}, {mix.memories_per_request():.1f} memories "
        "written a request")
    try:
        with running_service(workdir, args.embedder, extra, code_dir=code_dir) as service:
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
            # The goal was set on the probe's mix (docs/benchmarks.md); on another mix it is
            # only indicative.
            same = "on the same mix" if args.mix == "probe" else "measured on --mix probe, not this mix"
            print(f"\npeak: {peak['2xx per s']:.1f} requests/s with {peak['clients']} clients "
                  f"(goal: >= 246, 10x the 24.6 {same}; "
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
                  mix: Mix = MIX, *, cookie: str = "", pages: int = 0) -> dict[str, float]:
    """One closed-loop round: 2xx/s and the CPU milliseconds each role spent per 2xx request."""
    before = cpu_seconds(service.runner.pid)
    recorder, elapsed = asyncio.run(closed_loop(service.base_url, agents, clients, seconds, mix,
                                                cookie=cookie, pages=pages))
    after = cpu_seconds(service.runner.pid)
    ok = [s for s in recorder.samples if 200 <= s.status < 300]
    failed = Counter((s.op, s.status) for s in recorder.samples if not 200 <= s.status < 300)
    if failed:
        log("non-2xx: " + ", ".join(f"{n}x {status} on {op}" for (op, status), n in sorted(failed.items())))
    row: dict[str, float] = {"2xx per s": len(ok) / elapsed, "non-2xx": len(recorder.samples) - len(ok),
                             "p50 ms": percentiles([s.ms for s in ok])["p50"]}
    if pages:
        row["page messages per s"] = recorder.page_messages / elapsed
        if recorder.pages_closed_early:
            log(f"pages closed early: {recorder.pages_closed_early[0]}")
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
            services, crowds, cookies = {}, {}, {}
            for (name, extra), workdir in zip(configs.items(), workdirs, strict=True):
                log(f"starting service {name} ({extra or 'default sizing'}) from {code_dirs[name]} in {workdir}")
                services[name] = stack.enter_context(running_service(workdir, args.embedder, extra, code_dirs[name]))
                school = services[name].make_school("soak", args.agents)
                crowds[name] = [Agent(n, a["stack"], a["secret"]) for n, a in enumerate(school["agents"])]
                cookies[name] = school["cookie"]
                asyncio.run(seed_and_baseline(services[name].base_url, crowds[name], 1))
            rounds: dict[str, list[dict[str, float]]] = {name: [] for name in configs}
            for n in range(args.rounds):
                for name in configs:
                    rounds[name].append(measure_round(services[name], crowds[name], args.compare_clients,
                                                      args.step_seconds, MIXES[args.mix], cookie=cookies[name],
                                                      pages=args.compare_pages))
                    log(f"round {n + 1} {name}: {rounds[name][-1]['2xx per s']:.1f} req/s")
            for name, service in services.items():
                log(f"service {name}: its vectors' model: {vector_models(service.database_url)}")
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


def run_costs(args: argparse.Namespace) -> int:
    """What each operation of the mix costs on its own: closed-loop rounds of one operation at a
    time, in turn (`--rounds` of each, medians), with the CPU milliseconds the web server and
    PostgreSQL spent per request. A push carries the mix's own sizes (the bulk lane's included).
    Not the worker's: it embeds the rounds' writes during the later rounds, whatever they run
    (`embedding_throughput.py` has the model's cost per memory)."""
    import shutil
    import statistics

    workdir = Path(tempfile.mkdtemp(prefix="memoryhub-costs-"))
    mix = MIXES[args.mix]
    try:
        with running_service(workdir, args.embedder, {}) as service:
            school = service.make_school("soak", args.agents)
            agents = [Agent(n, a["stack"], a["secret"]) for n, a in enumerate(school["agents"])]
            asyncio.run(seed_and_baseline(service.base_url, agents, 1))
            rounds: dict[str, list[dict[str, float]]] = {op: [] for op in mix.weights}
            for n in range(args.rounds):
                for op in mix.weights:
                    rounds[op].append(measure_round(service, agents, args.compare_clients, args.step_seconds,
                                                    Mix({op: 1}, mix.push_sizes)))
                    log(f"round {n + 1} {op}: {rounds[op][-1]['2xx per s']:.1f} req/s")
            columns = ("2xx per s", "non-2xx", "p50 ms", "web cpu ms/req", "postgres cpu ms/req")
            medians = {op: {column: statistics.median(r[column] for r in measured) for column in columns}
                       for op, measured in rounds.items()}
            share = sum(mix.weights.values())
            weighted = {column: sum(medians[op][column] * weight / share for op, weight in mix.weights.items())
                        for column in columns[-2:]}
            rows: list[dict[str, Any]] = [{"operation": op, **row} for op, row in medians.items()]
            rows.append({"operation": f"the {args.mix} mix (weighted)", **weighted})
            grown = average_stack_size(service.database_url)
            print_table(f"costs: each operation alone, {args.rounds} rounds of {args.step_seconds:g} s, "
                        f"{args.compare_clients} closed-loop clients, {args.agents} stacks of {SEED_MEMORIES} "
                        f"memories at the start and {grown:.0f} on average at the end "
                        "(medians; CPU ms per 2xx request)", rows)
        return 0
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=100, help="agents, each with its own stack and key")
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the soak")
    # A p95 needs samples: of 20 it is the second slowest, and whether one of the rare pushes
    # carrying hundreds of operations is among them moved the push baseline from one run to the
    # next; of 100 it is a push of the mix's own 95th percentile.
    parser.add_argument("--baseline-samples", type=int, default=100, help="unloaded samples per operation")
    parser.add_argument("--embedder", default=os.environ.get("EMBEDDING_PROVIDER", "minilm"),
                        choices=["minilm", "hash"], help="EMBEDDING_PROVIDER of the service (default: the shipped one)")
    parser.add_argument("--web-workers", type=int, default=0, help="WEB_WORKERS (default: the runner's own)")
    parser.add_argument("--concurrency", type=int, default=0, help="CELERY_CONCURRENCY (default: the runner's own)")
    parser.add_argument("--saturate", action="store_true", help="closed loop, clients added until the peak")
    parser.add_argument("--mix", choices=sorted(MIXES), default="agents",
                        help="--saturate / --compare: the agents' mix (the soak's) or the first probe's")
    parser.add_argument("--step-seconds", type=float, default=20.0, help="--saturate / --compare: seconds per step")
    parser.add_argument("--compare", default="", metavar="NAME=VALUE[,…]",
                        help="A/B: a second service with these settings, loaded in turn with the first")
    parser.add_argument("--compare-base", default="", metavar="DIR",
                        help="--compare: run service A from this other checkout (the code before a change); "
                             "--saturate: find that checkout's peak, with this load generator")
    parser.add_argument("--rounds", type=int, default=3, help="--compare: rounds per service")
    parser.add_argument("--compare-clients", type=int, default=4, help="--compare: closed-loop clients")
    parser.add_argument("--compare-pages", type=int, default=0,
                        help="--compare: live student pages open during each round, as in the soak")
    parser.add_argument("--costs", action="store_true",
                        help="each operation of --mix alone, in turn: requests/s and CPU ms per request")
    args = parser.parse_args()
    if args.costs:
        return run_costs(args)
    if args.compare or (args.compare_base and not args.saturate):
        return run_compare(args)
    return run_saturate(args) if args.saturate else run_soak(args)


if __name__ == "__main__":
    sys.exit(main())
