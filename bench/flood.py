"""Flood: bulk pushes against interactive reads, through the real runner (docs/benchmarks.md "Flood").

    .venv/bin/python bench/flood.py --lanes both          # before (lanes off) and after, side by side
    .venv/bin/python bench/flood.py --quick --lanes off   # smoke-sized, 1-2 minutes

One run per lanes setting starts the real runner (bench/service.py) in a throw-away data dir on free
ports with `MEMORYHUB_LANES=off` or `on` and the `hash` embedder by default (`--embedder minilm`
for the shipped one), makes three unlimited schools with one key per stack (school keys in F and Q,
stack-bound in K), seeds one stack in F and one in Q with `--memories` notes (kernle pushes of 500)
and waits for their embeddings. Readers: closed-loop clients (`--readers`, one key each) alternating
a search and a load of one stack, `--think` seconds between. Pushers: `--pushers` clients pushing
`--batch`-operation kernle batches without pause, each rotating over 3 keys and stacks of its own
(so the per-key push budget does not bind), honouring Retry-After on 503 / 429 by sending the same
batch again after it. Pushers run in a process of their own (bench/flood_clients.py). Every client
comes from 127.0.0.1 without X-Forwarded-For. Phases, each on fresh pusher stacks, with the embedding
backlog drained (up to `--settle-seconds`) between them:

1. unloaded: F's readers alone, then Q's readers alone, then one Q reader alone;
2. pushers alone, `--flood-seconds` (their goodput: operations acknowledged a second);
3. A, one school: F's readers on the seeded stack while F's pushers flood the same school;
4. B, two schools: Q's readers while F's pushers flood;
5. C, 16 keys behind one address: 16 stack-bound keys of school K push batches of 10 at 95 % of the
   per-key push budget (read from the service's settings) for `--keys-seconds`, their first pushes
   spread evenly over one interval (agents of their own, not in step), next to one Q reader.

Goals (PASS/FAIL): A's and B's reader p95 of search and of load <= 3x unloaded; goodput under the
flood >= 0.5x the pushers alone; no 5xx but a 503 with Retry-After, no answer missing, every 503 /
429 with the error contract's body; every acknowledged operation stored exactly once (Postgres, as
the soak checks); in C the slowest key pushes >= half its budget a minute and the reader's p95
<= 3x unloaded. `--lanes both` runs the whole thing with lanes off, then on, and prints them side
by side; `--json PATH` (or `-`) writes the figures. Each run also prints where the readers' time went,
unloaded and loaded, phase by phase: the slowest 5 % of the reads and their fastest half, split by the
service's Server-Timing (its CPU, its statements, waiting inside it, and the rest outside it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
if str(BASE_DIR) not in sys.path:
    sys.path.insert(0, str(BASE_DIR))

from bench.flood_clients import Key, PushResult, Reads, interactive, run_pushers, seed, warm_up  # noqa: E402
from bench.harness import Machine, log, percentiles, print_listed, print_table  # noqa: E402
from bench.service import RunnerService, runner_service  # noqa: E402
from bench.soak_agents import ahead_of_the_service  # noqa: E402
from bench.soak_report import (  # noqa: E402
    backlog,
    cpu_seconds,
    drain,
    split_columns,
    stored_counts,
    where_the_time_went,
)
from memoryhub.cpu_cgroup import autogroup_on, cpu_cgroup_path  # noqa: E402

KEYS_PER_PUSHER = 3
READERS_KEYS = 4  # F's and Q's first stacks' keys: the readers' (stack 0 is the seeded one)
CROWD_KEYS = 16
CROWD_BATCH = 10
CROWD_PACE = 0.95  # of the per-key push budget: a fixed window never sees one push too many
RATIO_GOAL = 3.0
# Each goal's readers: the part of the run, its unloaded reads and its loaded reads (keys of `reads`).
READ_PHASES = (("A", "quiet_f", "flood_f"), ("B", "quiet_q", "flood_q"), ("C", "quiet_one", "crowd_q"))
READ_OPS = ("search", "load")  # what the readers alternate (bench/flood_clients.py `interactive`)
GOODPUT_GOAL = 0.5
FULL = {"memories": 2000, "interactive_seconds": 30.0, "flood_seconds": 60.0, "pushers": 8,
        "keys_seconds": 30.0, "settle_seconds": 180.0}
QUICK = {"memories": 500, "interactive_seconds": 6.0, "flood_seconds": 12.0, "pushers": 4,
         "keys_seconds": 10.0, "settle_seconds": 20.0}

BUDGET_SCRIPT = """
import json
from django.conf import settings
print("RATES=" + json.dumps(settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]))
"""


def push_budget(service: RunnerService) -> float:
    """A key's pushes a minute as the running service allows them: its `sync_push` rate (the push
    views' only per-key throttle, accounts/throttles.py), read through the service's own settings."""
    done = subprocess.run([sys.executable, "manage.py", "shell", "-c", BUDGET_SCRIPT], cwd=service.code_dir,
                          env=service.env, capture_output=True, text=True, timeout=120, check=True)
    [line] = [x for x in done.stdout.splitlines() if x.startswith("RATES=")]
    count, period = json.loads(line.removeprefix("RATES="))["sync_push"].split("/")
    return int(count) * 60 / {"s": 1, "m": 60, "h": 3600, "d": 86400}[period.strip()[0]]


def autogroup_state(runner_pid: int) -> str:
    """Whether the kernel weighs the service's sessions as groups (docs/architecture.md §5.7 "CPU
    priority"): the readers' figures differ with it, so every run says which it had. Out of the root
    CPU cgroup (memoryhub.cpu_cgroup) autogroup does not apply."""
    if not autogroup_on():
        return "autogroup off"
    cgroup = cpu_cgroup_path(runner_pid)
    return "autogroup on" if cgroup == "/" else f"autogroup on, but the service in the CPU cgroup {cgroup}"


def keys_of(school: dict[str, Any]) -> list[Key]:
    return [Key(a["stack"], a["secret"]) for a in school["agents"]]


class Phases:
    """One service's phases: readers in this process, pushers in the pool's process, started
    together on a wall-clock instant."""

    def __init__(self, service: RunnerService, pool: ProcessPoolExecutor, args: argparse.Namespace) -> None:
        self.service, self.pool, self.args = service, pool, args
        self.pushed = PushResult()  # every phase's pushes, for the status and exactly-once goals
        self.read = Reads()  # every phase's reads, likewise
        self.backlogs: dict[str, int] = {}
        self.cores: dict[str, dict[str, float]] = {}  # by phase: the service's cores by part
        # by phase: the runner's switches of the worker's priority and of the embedding hold since the
        # phase before ended (the settling between them included), each with when it was logged,
        # in seconds from the phase's start (negative: while the backlog settled before it)
        self.switches: dict[str, list[str]] = {}
        self._switch_times: list[tuple[float, str]] = []  # (wall clock when first seen, what was said)
        self._switches_until = time.time()
        threading.Thread(target=self._watch_switches, name="switch-watch", daemon=True).start()

    def _watch_switches(self) -> None:
        """Read the runner's switches four times a second, for as long as its log is there."""
        while True:
            try:
                said = self.service.worker_priority_switches()
            except OSError:
                return  # the run is over and its data dir gone
            now = time.time()
            self._switch_times.extend((now, line) for line in said[len(self._switch_times):])
            time.sleep(0.25)

    def run(self, name: str, seconds: float, readers: list[Key], pushers: list[list[Key]] | None = None,
            batch: int = 500, interval: float = 0.0) -> tuple[Reads, PushResult]:
        self.backlogs[name] = backlog(self.service.database_url)
        start_at = time.time() + 0.5
        spent_before, measured_from = cpu_seconds(self.service.runner.pid), time.time()
        future = (self.pool.submit(run_pushers, self.service.base_url, pushers, seconds, batch, interval, start_at,
                                   len(self.backlogs)) if pushers else None)
        recorder = (asyncio.run(interactive(self.service.base_url, readers, seconds, self.args.think, start_at))
                    if readers else Reads())
        pushed = future.result() if future is not None else PushResult()
        spent = cpu_seconds(self.service.runner.pid)
        elapsed = time.time() - measured_from  # the CPU read covers the start's half second too
        self.cores[name] = {part: round((spent[part] - spent_before.get(part, 0.0)) / elapsed, 2)
                            for part in ("web", "postgres", "worker") if part in spent}
        self.pushed.merge(pushed)
        self.read.extend(recorder)
        time.sleep(0.3)  # the watcher's next read, for a switch logged in the phase's last instant
        ended, self._switches_until = self._switches_until, time.time()
        self.switches[name] = [f"{line} ({seen - start_at:+.1f} s)" for seen, line in list(self._switch_times)
                               if ended < seen <= self._switches_until]
        log(f"{name}: {len(recorder.samples)} reads, {sum(pushed.statuses.values())} pushes "
            f"({pushed.acked_ops:,} operations acknowledged); statuses "
            f"{dict(Counter(s.status for s in recorder.samples) + pushed.statuses)}; the service's cores: "
            + ", ".join(f"{part} {used:.2f}" for part, used in self.cores[name].items()))
        return recorder, pushed


def p95(recorder: Reads, op: str) -> float:
    return float(percentiles([s.ms for s in recorder.samples if s.op == op and 200 <= s.status < 300])["p95"])


def ratio(loaded: float, quiet: float) -> float:
    return loaded / quiet if quiet > 0 else float("nan")


def run_lanes(args: argparse.Namespace, lanes: str) -> dict[str, Any]:
    """The whole flood against one service with `MEMORYHUB_LANES=<lanes>`: its figures and goals."""
    workdir = Path(tempfile.mkdtemp(prefix=f"memoryhub-flood-{lanes}-"))
    extra = {"EMBEDDING_PROVIDER": args.embedder, "LOG_LEVEL": "WARNING", "MEMORYHUB_LANES": lanes}
    log(f"lanes {lanes}: starting the service (runner) in {workdir}; embedder {args.embedder}")
    try:
        with runner_service(workdir / "var", workdir / "runner.log", extra_env=extra) as service:
            log(autogroup_state(service.runner.pid))
            sets = 3  # fresh pusher stacks for: pushers alone, A, B
            flood = keys_of(service.make_school("flood", READERS_KEYS + sets * args.pushers * KEYS_PER_PUSHER,
                                                stack_bound_keys=False))
            quiet = keys_of(service.make_school("quiet", READERS_KEYS, stack_bound_keys=False))
            crowd = keys_of(service.make_school("crowd", CROWD_KEYS))
            budget = push_budget(service)
            f_readers = [Key(flood[0].stack, k.secret) for k in flood[:args.readers]]
            q_readers = [Key(quiet[0].stack, k.secret) for k in quiet[:args.readers]]
            pusher_keys = flood[READERS_KEYS:]

            def pushers(n: int) -> list[list[Key]]:
                first = n * args.pushers * KEYS_PER_PUSHER
                return [pusher_keys[first + p * KEYS_PER_PUSHER:first + (p + 1) * KEYS_PER_PUSHER]
                        for p in range(args.pushers)]

            with ahead_of_the_service() as priority, ProcessPoolExecutor(
                    1, mp_context=multiprocessing.get_context("spawn")) as pool:
                log(f"load generator {priority}")
                pool.submit(warm_up).result()
                log(f"seeding {args.memories:,} memories into {flood[0].stack} and {quiet[0].stack}")
                seeded = asyncio.run(seed(service.base_url, [flood[0], quiet[0]], args.memories))
                drain(service.database_url, max(args.settle_seconds, 60.0))
                phases = Phases(service, pool, args)
                phases.pushed.merge(seeded)
                machine = Machine()
                machine.start()
                wide = args.interactive_seconds
                quiet_f, _ = phases.run("unloaded F", wide, f_readers)
                quiet_q, _ = phases.run("unloaded Q", wide, q_readers)
                quiet_one, _ = phases.run("unloaded Q, one reader", wide, q_readers[:1])
                _, alone = phases.run("pushers alone", args.flood_seconds, [], pushers(0))
                drain(service.database_url, args.settle_seconds)
                flood_f, under = phases.run("A: F floods F", args.flood_seconds, f_readers, pushers(1))
                drain(service.database_url, args.settle_seconds)
                flood_q, _ = phases.run("B: F floods, Q reads", args.flood_seconds, q_readers, pushers(2))
                drain(service.database_url, args.settle_seconds)
                crowd_q, crowd_pushed = phases.run(
                    "C: 16 keys on one address", args.keys_seconds, q_readers[:1], [[k] for k in crowd],
                    batch=CROWD_BATCH, interval=60 / (budget * CROWD_PACE))
                machine.stop()
            stored = stored_counts(service.database_url, phases.pushed.acked)
            fig = figures(lanes, phases, budget, stored, {
                "quiet_f": quiet_f, "quiet_q": quiet_q, "quiet_one": quiet_one, "flood_f": flood_f,
                "flood_q": flood_q, "crowd_q": crowd_q}, alone, under, crowd_pushed, args)
            fig["web processes replaced"] = service.web_processes_replaced()
            fig["errors logged"] = service.errors_logged()
            fig["machine"] = machine.line()
            return fig
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def figures(lanes: str, phases: Phases, budget: float, stored: Counter[str], reads: dict[str, Reads],
            alone: PushResult, under: PushResult, crowd: PushResult, args: argparse.Namespace) -> dict[str, Any]:
    """The run's figures (a flat dict, for the side-by-side table and --json) and its goals."""
    fig: dict[str, Any] = {"lanes": lanes}
    for part, quiet, loaded in READ_PHASES:
        for op in READ_OPS:
            before, during = p95(reads[quiet], op), p95(reads[loaded], op)
            fig[f"{part} {op} p95 unloaded ms"], fig[f"{part} {op} p95 loaded ms"] = before, during
            fig[f"{part} {op} p95 ratio"] = ratio(during, before)
    fig["A goodput alone ops/s"] = alone.acked_ops / max(alone.seconds, 1e-9)
    fig["A goodput flood ops/s"] = under.acked_ops / max(under.seconds, 1e-9)
    fig["A goodput ratio"] = ratio(fig["A goodput flood ops/s"], fig["A goodput alone ops/s"])
    fig["A push p95 ms (flood)"] = percentiles(under.latencies_ms)["p95"]
    per_key = [crowd.pushes_ok.get(k, 0) * 60 / max(crowd.seconds, 1e-9) for k in crowd.pushes_ok] or [0.0]
    per_key += [0.0] * (CROWD_KEYS - len(crowd.pushes_ok))
    fig["C budget pushes/min per key"] = budget
    fig["C slowest key pushes/min"] = min(per_key)
    fig["C median key pushes/min"] = sorted(per_key)[len(per_key) // 2]
    read, pushed = phases.read, phases.pushed
    statuses = Counter(s.status for s in read.samples) + pushed.statuses
    codes = pushed.codes + Counter((s.status, s.error) for s in read.samples if s.status >= 300)
    fig["answers by status"] = {str(k): v for k, v in sorted(statuses.items())}
    fig["non-2xx by code"] = {f"{status} {code}": n for (status, code), n in sorted(codes.items())}
    fig["reads refused (503/429)"] = sum(1 for s in read.samples if s.status in (429, 503))
    fig["pushes refused 503"] = pushed.statuses.get(503, 0)
    fig["pushes refused 429"] = pushed.statuses.get(429, 0)
    fig["seconds pushers waited on Retry-After"] = pushed.waited_seconds
    fig["bad 5xx / no answer / missing Retry-After / malformed"] = [
        sum(n for status, n in statuses.items() if status >= 500 and status != 503), statuses.get(0, 0),
        pushed.without_retry_after + read.without_retry_after, pushed.malformed + read.malformed]
    acked = phases.pushed.acked
    fig["acknowledged operations"] = len(acked)
    fig["lost"] = sum(1 for rid in acked if stored[rid] == 0)
    fig["duplicated"] = sum(1 for rid in acked if stored[rid] > 1) + len(acked) - len(set(acked))
    fig["backlog at phase start"] = phases.backlogs
    fig["cores by phase"] = phases.cores
    fig["switches by phase"] = phases.switches
    fig["reader loop lag p95 ms"] = percentiles(phases.read.loop_lag_ms)["p95"]
    bad, no_answer, missing, malformed = fig["bad 5xx / no answer / missing Retry-After / malformed"]
    goals = [(f"A {op}: p95 under the flood {fig[f'A {op} p95 loaded ms']:.0f} ms <= {RATIO_GOAL:g}x unloaded "
              f"{fig[f'A {op} p95 unloaded ms']:.0f} ms ({fig[f'A {op} p95 ratio']:.2f}x)",
              fig[f"A {op} p95 ratio"] <= RATIO_GOAL) for op in READ_OPS]
    goals.append((f"A goodput under the flood {fig['A goodput flood ops/s']:,.0f} ops/s >= {GOODPUT_GOAL:g}x the "
                  f"pushers alone {fig['A goodput alone ops/s']:,.0f} ({fig['A goodput ratio']:.2f}x)",
                  fig["A goodput ratio"] >= GOODPUT_GOAL))
    goals.append((f"no 5xx but 503 with Retry-After: other 5xx {bad}, no answer {no_answer}, 503/429 without "
                  f"Retry-After {missing}, without the error body {malformed}",
                  bad == no_answer == missing == malformed == 0))
    goals.append((f"acknowledged operations {len(acked):,} stored exactly once: lost {fig['lost']}, duplicated "
                  f"{fig['duplicated']}", fig["lost"] == fig["duplicated"] == 0 and len(acked) > 0))
    goals += [(f"B {op}: Q's p95 while F floods {fig[f'B {op} p95 loaded ms']:.0f} ms <= {RATIO_GOAL:g}x unloaded "
               f"{fig[f'B {op} p95 unloaded ms']:.0f} ms ({fig[f'B {op} p95 ratio']:.2f}x)",
               fig[f"B {op} p95 ratio"] <= RATIO_GOAL) for op in READ_OPS]
    goals.append((f"C slowest of {CROWD_KEYS} keys on one address {fig['C slowest key pushes/min']:.1f} pushes/min "
                  f">= half its budget {budget:g}/min", fig["C slowest key pushes/min"] >= budget / 2))
    goals += [(f"C {op}: the reader's p95 {fig[f'C {op} p95 loaded ms']:.0f} ms <= {RATIO_GOAL:g}x unloaded "
               f"{fig[f'C {op} p95 unloaded ms']:.0f} ms ({fig[f'C {op} p95 ratio']:.2f}x)",
               fig[f"C {op} p95 ratio"] <= RATIO_GOAL) for op in READ_OPS]
    fig["where the readers' time went"] = {
        f"{part} {op}": {"unloaded": where_the_time_went([s for s in reads[quiet].samples if s.op == op]),
                         "loaded": where_the_time_went([s for s in reads[loaded].samples if s.op == op])}
        for part, quiet, loaded in READ_PHASES for op in READ_OPS}
    fig["goals"] = [{"goal": text, "pass": bool(passed)} for text, passed in goals]
    fig["sizes"] = {name: getattr(args, name) for name in (*FULL, "readers", "think", "embedder")}
    return fig


def report(runs: list[dict[str, Any]]) -> bool:
    """Each run's statuses and goals, then (two runs) the figures side by side."""
    for fig in runs:
        sizes = fig["sizes"]
        print(f"\n== lanes {fig['lanes']}: {sizes['readers']} readers (think {sizes['think']:g} s) on a "
              f"{sizes['memories']:,}-memory stack, {sizes['pushers']} pushers of 500, floods of "
              f"{sizes['flood_seconds']:g} s, embedder {sizes['embedder']}")
        print(fig["machine"])
        print("answers by status (0 = no answer): "
              + ", ".join(f"{status}: {n:,}" for status, n in fig["answers by status"].items()))
        print("non-2xx by code: " + (", ".join(f"{code}: {n:,}" for code, n in fig["non-2xx by code"].items())
                                     or "none"))
        print("embedding backlog at each phase's start: "
              + ", ".join(f"{name} {n:,}" for name, n in fig["backlog at phase start"].items()))
        print("the service's cores in each phase: " + "; ".join(
            f"{name} " + ", ".join(f"{part} {used:.2f}" for part, used in parts.items())
            for name, parts in fig["cores by phase"].items()))
        print(f"readers' own event-loop lag p95 {fig['reader loop lag p95 ms']:.1f} ms (in every reader figure)")
        print("the worker's priority and embedding hold, switched by the end of each phase since the one before "
              "(the runner's log; seconds from the phase's start): "
              + "; ".join(f"{name}: " + (", ".join(lines) or "none")
                          for name, lines in fig["switches by phase"].items()))
        print_listed("web processes replaced by uvicorn's supervisor", fig["web processes replaced"], 6)
        print_listed("errors the service logged", fig["errors logged"], 10)
        print_table("where the readers' time went: the slowest 5 % of each phase's reads (slow) and their "
                    "fastest half, ms, means; cpu, db and waiting are inside the service (its Server-Timing), "
                    "outside is the rest of what the reader waited",
                    [{"reads": f"{reads} {when}", **split_columns(split)}
                     for reads, splits in fig["where the readers' time went"].items()
                     for when, split in splits.items() if split is not None])
        print("Goals:")
        for goal in fig["goals"]:
            print(f"  {'PASS' if goal['pass'] else 'FAIL'}  {goal['goal']}")
    names = [name for name, value in runs[0].items() if isinstance(value, int | float) and name != "lanes"]
    print_table("figures" + (" side by side (before: lanes off, after: lanes on)" if len(runs) > 1 else ""),
                [{"figure": name, **{f"lanes {fig['lanes']}": fig[name] for fig in runs}} for name in names])
    return all(goal["pass"] for goal in runs[-1]["goals"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lanes", choices=["on", "off", "both"], default="both",
                        help="MEMORYHUB_LANES of the service; both: off, then on, side by side")
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke test: about 3 minutes a service)")
    parser.add_argument("--flood-seconds", type=float, help=f"each flood phase (default {FULL['flood_seconds']:g})")
    parser.add_argument("--pushers", type=int, help=f"pusher clients (default {FULL['pushers']})")
    parser.add_argument("--memories", type=int, help=f"memories in the readers' stacks (default {FULL['memories']})")
    parser.add_argument("--interactive-seconds", type=float,
                        help=f"each unloaded phase (default {FULL['interactive_seconds']:g})")
    parser.add_argument("--keys-seconds", type=float, help=f"phase C (default {FULL['keys_seconds']:g})")
    parser.add_argument("--settle-seconds", type=float,
                        help=f"at most this long waiting for the embedding backlog between phases "
                             f"(default {FULL['settle_seconds']:g})")
    parser.add_argument("--readers", type=int, default=4, choices=range(1, READERS_KEYS + 1),
                        help="closed-loop readers per school")
    parser.add_argument("--think", type=float, default=0.1, help="a reader's pause between requests (s)")
    parser.add_argument("--embedder", default="hash", choices=["hash", "minilm"],
                        help="EMBEDDING_PROVIDER (default hash: the flood's embedding stays cheap)")
    parser.add_argument("--json", metavar="PATH", help="write the figures as JSON to PATH (- for stdout)")
    args = parser.parse_args()
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    runs = [run_lanes(args, lanes) for lanes in (["off", "on"] if args.lanes == "both" else [args.lanes])]
    passed = report(runs)
    if args.json:
        text = json.dumps(runs, indent=2, default=str)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
