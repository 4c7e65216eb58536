"""The worker's scheduling policy against the soak's latency, both measured in one soak.

    .venv/bin/python bench/worker_policy.py                      # 100 agents, 4 rounds of 2 x 40 s
    .venv/bin/python bench/worker_policy.py --agents 50 --rounds 2 --segment-seconds 20

While embedding keeps up, the runner runs the worker's threads at SCHED_IDLE on top of its session's
niceness (memoryhub.worker_priority, docs/operations.md §8). This asks what that buys the requests.
One service (the real runner, bench/service.py) started with `WORKER_CPU_IDLE=off`, so the runner
keeps the niceness and leaves the policy to this script; 100 agents at the soak's pace
(bench/soak_agents.py, the open loop of bench/soak.py, its 20 live pages included) for segments of
`--segment-seconds`, the worker's threads switched between SCHED_IDLE and SCHED_OTHER before each
segment with the runner's own call (memoryhub.embedded.set_session_idle), in the order idle, normal
in odd rounds and normal, idle in even ones, so a trend of the machine or of the growing stacks
falls on both alike. A run on a noisy machine is read by its pairs: the ratio idle / normal of each
round's p95, and their median.

Reported per segment: p50 and p95 of all operations and p95 of each, the cores each part used.
Needs CAP_SYS_NICE (root) to put threads back to SCHED_OTHER; without it the script says so and stops.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
if str(BASE_DIR) not in sys.path:
    sys.path.insert(0, str(BASE_DIR))

from bench.harness import log, percentiles, print_table  # noqa: E402
from bench.soak import running_service  # noqa: E402
from bench.soak_agents import Agent, ahead_of_the_service, seed_and_baseline, soak  # noqa: E402
from bench.soak_report import cpu_seconds, service_processes  # noqa: E402
from memoryhub.embedded import session_threads, set_session_idle  # noqa: E402

OPERATIONS = ("search", "load", "write", "push", "pull")


def worker_session(runner_pid: int) -> int:
    """The pid of the worker process the runner started: its session's leader."""
    return service_processes(runner_pid)["worker"][0].pid


def policies(session: int) -> set[str]:
    names = {os.SCHED_IDLE: "idle", os.SCHED_OTHER: "normal"}
    found = set()
    for thread in session_threads(session):
        try:
            found.add(names.get(os.sched_getscheduler(thread), "other"))
        except OSError:
            continue  # gone meanwhile
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--segment-seconds", type=float, default=40.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--embedder", choices=("minilm", "hash"), default="minilm")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (CAP_SYS_NICE): only a privileged process may put threads back to SCHED_OTHER")
        return 2

    workdir = Path(tempfile.mkdtemp(prefix="memoryhub-worker-policy-"))
    log(f"starting the service in {workdir} with WORKER_CPU_IDLE=off (this script sets the policy)")
    rows: list[dict[str, Any]] = []
    try:
        measure(args, workdir, rows)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report(args, rows)
    return 0


def measure(args: argparse.Namespace, workdir: Path, rows: list[dict[str, Any]]) -> None:
    """The soak's segments, one row each, the worker's policy alternated."""
    with running_service(workdir, args.embedder, {"WORKER_CPU_IDLE": "off"}) as service:
        school = service.make_school("soak", args.agents)
        agents = [Agent(n, a["stack"], a["secret"]) for n, a in enumerate(school["agents"])]
        with ahead_of_the_service():
            asyncio.run(seed_and_baseline(service.base_url, agents, 1))
            for round_number in range(args.rounds):
                order = ("idle", "normal") if round_number % 2 == 0 else ("normal", "idle")
                for policy in order:
                    session = worker_session(service.runner.pid)
                    set_session_idle(session, policy == "idle")
                    before = cpu_seconds(service.runner.pid)
                    recorder, _pages, elapsed = asyncio.run(
                        soak(service, agents, school["cookie"], args.segment_seconds, lambda: None))
                    after = cpu_seconds(service.runner.pid)
                    ok = [s for s in recorder.samples if 200 <= s.status < 300]
                    overall = percentiles([s.ms for s in ok])
                    row: dict[str, Any] = {"round": round_number + 1, "worker policy": policy,
                                           "threads": "/".join(sorted(policies(session))),
                                           "requests": len(recorder.samples),
                                           "non-2xx": len(recorder.samples) - len(ok),
                                           "p50 ms": overall["p50"], "p95 ms": overall["p95"]}
                    for op in OPERATIONS:
                        row[f"{op} p95"] = percentiles([s.ms for s in ok if s.op == op])["p95"]
                    for role in ("web", "postgres", "worker"):
                        row[f"{role} cores"] = (after.get(role, 0.0) - before.get(role, 0.0)) / elapsed
                    rows.append(row)
                    log(f"round {round_number + 1} {policy}: p95 {overall['p95']:.1f} ms")


def report(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    print_table(f"{args.agents} agents, segments of {args.segment_seconds:g} s, the worker's policy alternated", rows)
    by_round: dict[int, dict[str, dict[str, Any]]] = {}
    for row in rows:
        by_round.setdefault(row["round"], {})[row["worker policy"]] = row
    print()
    for column in ("p50 ms", "p95 ms", *(f"{op} p95" for op in OPERATIONS), "worker cores"):
        ratios = [pair["idle"][column] / pair["normal"][column] for pair in by_round.values()
                  if pair["normal"][column]]
        print(f"idle / normal, {column}: median {statistics.median(ratios):.2f} "
              f"(rounds: {', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    raise SystemExit(main())
