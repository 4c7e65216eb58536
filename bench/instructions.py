"""Instructions a request of the agents' routes costs the web process: counted, not timed.

    .venv/bin/python bench/instructions.py                          # this checkout
    .venv/bin/python bench/instructions.py --base <checkout of X>   # and checkout X, same run
    .venv/bin/python bench/instructions.py --requests 10            # quicker while developing

WHY: a change worth 1-3 % of a request's CPU is under what two identical services differ by in a
timed A/B on a shared 2-core box (`bench/soak.py --compare`, ~7 %), so a timed run can neither
prove nor refute it. Valgrind's callgrind counts the instructions a process executes: the same
code, inputs and data give the same count to a few parts in ten thousand, whatever else the
machine is doing. docs/benchmarks.md "Instructions a request" says how to read the figures.

One run starts embedded PostgreSQL and Redis; for each checkout (this one, and `--base DIR` when
given) it makes a database migrated by that checkout's own code, a school with one stack and a
stack-bound key through that checkout's `manage.py` (as bench/soak.py does), then runs one Django
process of that checkout which, through Django's test client (the whole middleware,
authentication, throttles, view and serializers; no ASGI server, no socket to the client):

* logs the key in (`POST /auth/login`, as kernle's client does) and seeds the stack with one
  kernle push of `--seed-notes` notes, then embeds them (`manage.py reembed`, the `hash`
  embedder), both before callgrind starts;
* then, under callgrind, logs in again and, route by route in the agents' mix
  (bench/soak_agents.py: kernle push of 1-5 notes and pull with the token; search, load and a
  native write with the key): `--warmup` requests, then
  `--requests` counted ones. The bodies are made here once, from a fixed seed, and sent alike to
  every checkout.

Callgrind dumps its counters whenever the process calls `getppid` (the marker between phases), so
a route's count holds its counted requests and nothing else. Counted: user-space instructions of
the web process (Python, Django, psycopg, the Redis client); not the kernel's part of its socket
calls, not PostgreSQL's or Redis's own work. Throttle rates are raised inside the measured
process so no request is refused. What was loaded before the routes is frozen out of the cyclic
collector, as in a web process, and each route starts after a full collection: a route's count
holds the collections its own requests cause.

Reported: instructions per request of each route in each checkout, the ratio, and the mix's
average weighted as the soak's agents call the routes (search 30, load 15, write 20, push 20,
pull 15). Needs `valgrind` (Debian's package); a checkout's Django setup alone takes ~1.5 minutes
under it, so the checkouts run side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent
if str(BASE_DIR) not in sys.path:
    sys.path.insert(0, str(BASE_DIR))

from bench.harness import bench_environment, log, print_table  # noqa: E402
from bench.service import SCHOOL_SCRIPT  # noqa: E402
from bench.soak_agents import MIX, WORDS, kernle_ops, sentence  # noqa: E402

ROUTES = ("push", "pull", "search", "load", "write")
MARKER = "getppid"  # the libc call the measured process makes between phases (nothing else calls it)

# Runs inside `manage.py shell` of the checkout under test, under callgrind; its parameters come in
# MEMORYHUB_BENCH_INSTRUCTIONS. Written against the HTTP contract only, so any checkout runs it.
MEASURE_SCRIPT = """
import gc, json, os
from django.conf import settings
from django.test import Client
p = json.loads(open(os.environ["MEMORYHUB_BENCH_INSTRUCTIONS"]).read())
for scope in settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]:
    settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"][scope] = "100000000/min"
settings.THROTTLE_SCHOOL_RATE = "100000000/min"
client = Client(raise_request_exception=True)
key = {"HTTP_AUTHORIZATION": "Bearer " + p["secret"]}
token = {"HTTP_AUTHORIZATION": "Bearer " + client.post("/auth/login", **key).json()["token"]}
base = "/api/v1/stacks/" + p["stack"]
since = [None]

def send(route, body):
    if route == "push":
        response = client.post("/sync/push", data=body, content_type="application/json", **token)
    elif route == "pull":
        response = client.post("/sync/pull", data=json.dumps({"stack_id": p["stack"], "since": since[0]}),
                               content_type="application/json", **token)
        since[0] = response.json().get("server_time", since[0])
    elif route == "search":
        response = client.post(base + "/search", data=body, content_type="application/json", **key)
    elif route == "load":
        response = client.get(base + "/load", **key)
    else:
        response = client.post(base + "/memories", data=body, content_type="application/json", **key)
    if response.status_code not in (200, 201):
        raise SystemExit(f"{route}: {response.status_code} {response.content[:300]!r}")

if p["phase"] == "seed":
    send("push", p["seed"])
    raise SystemExit(0)
# As a web process does once it has loaded (memoryhub.interpreter.settle_heap), whatever the
# checkout's own setting: the collector's walks then cost what the requests allocate, not what was
# loaded before them. Collected again before each route's counted requests, so no route pays for
# the garbage of the one before.
gc.collect()
gc.freeze()
os.getppid()
for route in p["routes"]:
    for body in p["bodies"][route][:p["warmup"]]:
        send(route, body)
    gc.collect()
    os.getppid()
    for body in p["bodies"][route][p["warmup"]:]:
        send(route, body)
    os.getppid()
print("MEASURED")
"""


def request_bodies(stack: str, *, seed: int, warmup: int, requests: int) -> dict[str, list[str]]:
    """Each route's request bodies, the same for every checkout (pull and load send none)."""
    rng = random.Random(seed)
    count = warmup + requests
    return {
        "push": [json.dumps({"stack_id": stack, "operations": kernle_ops(rng, stack, rng.randint(1, 5))})
                 for _ in range(count)],
        "pull": [""] * count,
        "search": [json.dumps({"query": " ".join(rng.sample(WORDS, 2)), "limit": 10}) for _ in range(count)],
        "load": [""] * count,
        "write": [json.dumps({"kind": "note", "content": sentence(rng)}) for _ in range(count)],
    }


def prepared_checkout(label: str, code_dir: Path, database_url: str, redis_url: str,
                      workdir: Path) -> dict[str, str]:
    """A database of its own, migrated by `code_dir`, with a school made by its `manage.py`: the
    environment its measured process runs with."""
    import psycopg

    name = f"instructions_{label}"
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    env = {**os.environ, "DATABASE_URL": urlsplit(database_url)._replace(path=f"/{name}").geturl(),
           "REDIS_URL": redis_url, "EMBEDDING_PROVIDER": "hash", "PYTHONHASHSEED": "0",
           # Time runs ~50x slower under valgrind: a verified key stays remembered for the whole run,
           # as it does at full speed for an agent that calls every few seconds, whatever lifetime
           # the checkout's default is.
           "AUTH_KEY_CACHE_SECONDS": "3600",
           "DJANGO_SETTINGS_MODULE": "memoryhub.settings"}
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=code_dir, env=env,
                   check=True)
    school = {"slug": f"instructions-{label}", "stacks": 1, "stack_bound_keys": True, "webhook_url": ""}
    done = subprocess.run([sys.executable, "manage.py", "shell", "-c", SCHOOL_SCRIPT], cwd=code_dir,
                          env={**env, "MEMORYHUB_BENCH_SCHOOL": json.dumps(school)}, capture_output=True,
                          text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{label}: making the school failed:\n{done.stderr[-3000:]}")
    [line] = [x for x in done.stdout.splitlines() if x.startswith("SCHOOL=")]
    [agent] = json.loads(line.removeprefix("SCHOOL="))["agents"]
    env["MEMORYHUB_BENCH_AGENT"] = json.dumps(agent)
    (workdir / label).mkdir()
    return env


def measured(label: str, code_dir: Path, env: dict[str, str], workdir: Path,
             args: argparse.Namespace) -> dict[str, int]:
    """Instructions of each route's counted requests in checkout `code_dir`, from callgrind's dumps."""
    agent = json.loads(env["MEMORYHUB_BENCH_AGENT"])
    stack = agent["stack"]
    bodies = request_bodies(stack, seed=args.seed, warmup=args.warmup, requests=args.requests)
    seed_rng = random.Random(args.seed + 1)
    params = {"secret": agent["secret"], "stack": stack, "routes": list(args.routes), "warmup": args.warmup,
              "seed": json.dumps({"stack_id": stack, "operations": kernle_ops(seed_rng, stack, args.seed_notes)}),
              "bodies": bodies}
    out = workdir / label
    env = {**env, "MEMORYHUB_BENCH_INSTRUCTIONS": str(out / "params.json")}
    shell = [sys.executable, "manage.py", "shell", "-c", MEASURE_SCRIPT]
    # The seed, and its vectors (no worker runs here), before anything is counted: searches then
    # run both legs, as in the service.
    (out / "params.json").write_text(json.dumps({**params, "phase": "seed"}))
    subprocess.run(shell, cwd=code_dir, env=env, check=True, capture_output=True)
    subprocess.run([sys.executable, "manage.py", "reembed"], cwd=code_dir, env=env, check=True, capture_output=True)
    (out / "params.json").write_text(json.dumps({**params, "phase": "measure"}))
    log(f"{label}: counting {', '.join(args.routes)} under callgrind in {code_dir}")
    done = subprocess.run(["valgrind", "--tool=callgrind", f"--dump-before={MARKER}",
                           f"--callgrind-out-file={out}/callgrind.out", *shell],
                          cwd=code_dir, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0 or "MEASURED" not in done.stdout:
        raise RuntimeError(f"{label}: the measured process failed:\n{done.stderr[-3000:]}")
    # One dump per marker, numbered from 1: the last two per route are its warm-up and its counted
    # requests (anything before them is setup and the seed).
    totals = {}
    for path in out.glob("callgrind.out.*"):
        match = re.search(r"^totals: (\d+)", path.read_text(errors="replace"), re.M)
        if match:
            totals[int(path.suffix.lstrip("."))] = int(match[1])
    counted = sorted(totals)[-2 * len(args.routes):][1::2]
    return {route: totals[dump] for route, dump in zip(args.routes, counted, strict=True)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="", metavar="DIR", help="a second checkout, counted in the same run")
    parser.add_argument("--requests", type=int, default=30, help="counted requests per route")
    parser.add_argument("--warmup", type=int, default=10, help="requests per route before counting")
    parser.add_argument("--seed-notes", type=int, default=300, help="notes the stack holds before the routes run")
    parser.add_argument("--seed", type=int, default=7, help="the bodies' random seed")
    parser.add_argument("--routes", nargs="+", choices=ROUTES, default=list(ROUTES))
    parser.add_argument("--keep", action="store_true",
                        help="keep callgrind's files (callgrind_annotate shows where a route's instructions go)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    checkouts = {"this": BASE_DIR}
    if args.base:
        checkouts = {"base": Path(args.base).resolve(), **checkouts}
    workdir = Path(tempfile.mkdtemp(prefix="memoryhub-instructions-"))
    try:
        with bench_environment("instructions") as env:
            # Each checkout has its own Redis database too: nothing cached by one is read by the other.
            prepared = {label: prepared_checkout(label, code_dir, env.database_url,
                                                 urlsplit(env.redis_url)._replace(path=f"/{n + 1}").geturl(), workdir)
                        for n, (label, code_dir) in enumerate(checkouts.items())}
            with ThreadPoolExecutor(max_workers=len(checkouts)) as pool:
                futures = {label: pool.submit(measured, label, code_dir, prepared[label], workdir, args)
                           for label, code_dir in checkouts.items()}
                counts = {label: future.result() for label, future in futures.items()}
    finally:
        if args.keep:
            log(f"callgrind's files: {workdir}/<checkout>/callgrind.out.<dump>")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    weights = MIX.weights
    rows: list[dict[str, Any]] = []
    for route in [*args.routes, "mix"]:
        if route == "mix":
            total = sum(weights[r] for r in args.routes)
            per = {label: sum(weights[r] * c[r] for r in args.routes) / total / args.requests
                   for label, c in counts.items()}
        else:
            per = {label: c[route] / args.requests for label, c in counts.items()}
        row: dict[str, Any] = {"route": route if route != "mix" else "the agents' mix (weighted)"}
        row.update({f"{label} instructions": round(value) for label, value in per.items()})
        if "base" in per:
            row["this / base"] = f"{per['this'] / per['base']:.3f}"
        rows.append(row)
    print_table(f"instructions a request in the web process ({args.requests} counted requests a route, "
                f"a stack of {args.seed_notes}+ notes)", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
