"""Live dashboard latency and the cost of change events on pushes.

    .venv/bin/python bench/live.py                                  # 50 pages on 10 stacks, 100 writes
    .venv/bin/python bench/live.py --pages 10 --stacks 5 --writes 40 --push-memories 5000   # small

One run against real embedded Postgres and Redis and the real ASGI app under uvicorn (one worker):

* **latency to a websocket client**: `--ws-clients` plain websocket clients (the `websockets`
  library, one thread each) signed in as a school admin, on the student sockets of `--stacks`
  stacks; the floor the browser adds its work to.
* **latency to the DOM**: `--pages` student pages open in one real Chromium (Debian's, through
  Playwright), spread over the same stacks; a MutationObserver in each page stamps the moment a
  memory's row is inserted (page clock = this machine's clock).
* Each write is `memory_create` in this process, one transaction; its commit time is stamped by
  an on-commit hook registered before the write's own (so before the event is even published).
  Writes go to the stacks in turn, `--interval` apart. Reported: p50/p95/max per path.
* **push throughput with change events on vs off**: `POST /sync/push` batches (bench/sync.py's
  kernle-shaped operations) alternating between this server — events on, with every page still
  open and watching the pushed stack — and a second server with MEMORYHUB_EVENTS=off.

Goals: p95 <= 250 ms to the DOM; push throughput with events >= 0.95x without.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import bench_environment, log, percentiles, print_table, web_server
from bench.sync import http_push, make_operations

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
# Stamps, in each page, when a memory's row enters the DOM (ms since the epoch, sub-ms precision).
OBSERVER_JS = """() => {
  window.__arrived = {};
  new MutationObserver((mutations) => {
    const now = performance.timeOrigin + performance.now();
    for (const m of mutations) for (const node of m.addedNodes) {
      if (node.id && node.id.startsWith("memory-") && !(node.id in window.__arrived)) window.__arrived[node.id] = now;
    }
  }).observe(document.body, {childList: true, subtree: true});
}"""


class SocketClient(threading.Thread):
    """One signed-in websocket on a student socket; records when each memory id first arrives."""

    def __init__(self, url: str, origin: str, cookie: str) -> None:
        super().__init__(daemon=True)
        self.url, self.origin, self.cookie = url, origin, cookie
        self.arrived: dict[str, float] = {}
        self.ready = threading.Event()
        self.stop = threading.Event()

    def run(self) -> None:
        from websockets.exceptions import ConnectionClosed
        from websockets.sync.client import connect
        from websockets.typing import Origin

        with connect(self.url, origin=Origin(self.origin), additional_headers={"Cookie": self.cookie}) as socket:
            self.ready.set()
            while not self.stop.is_set():
                try:
                    text = socket.recv(timeout=0.5)
                except TimeoutError:
                    continue
                except ConnectionClosed:
                    return
                now = time.time()
                message = json.loads(text)
                for row in message.get("rows", []):
                    self.arrived.setdefault(row["id"], now)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pages", type=int, default=50, help="student pages open in Chromium (default 50)")
    parser.add_argument("--ws-clients", type=int, default=10, help="plain websocket clients (default 10)")
    parser.add_argument("--stacks", type=int, default=10, help="stacks the pages and clients watch (default 10)")
    parser.add_argument("--writes", type=int, default=100, help="measured writes (default 100)")
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between writes (default 0.25)")
    parser.add_argument("--push-memories", type=int, default=20_000,
                        help="operations pushed to each server for the events on/off comparison (default 20,000)")
    parser.add_argument("--batch", type=int, default=500, help="operations per push (default 500)")
    args = parser.parse_args()

    with bench_environment("live") as env:
        from django.db import transaction
        from django.test import Client

        from accounts.models import Membership, Organization, User
        from accounts.services import api_key_issue
        from memories.services import memory_create
        from stacks.models import Stack

        org = Organization.objects.create(name="Bench live", slug=f"bench-live-{uuid.uuid4().hex[:6]}",
                                          tier="unlimited")
        admin = User.objects.create_user(username=f"bench-admin-{uuid.uuid4().hex[:6]}")
        Membership.objects.create(user=admin, organization=org, role=Membership.Role.ADMIN)
        stacks = [Stack.objects.create(organization=org, slug=f"student-{i:03d}") for i in range(args.stacks)]
        for slug in ("push-on", "push-off"):
            Stack.objects.create(organization=org, slug=slug)
        _, secret = api_key_issue(organization=org, user=admin, stack_id=None, name="bench")
        browser_client = Client()
        browser_client.force_login(admin)
        from django.conf import settings

        session = browser_client.cookies[settings.SESSION_COOKIE_NAME].value
        cookie = f"{settings.SESSION_COOKIE_NAME}={session}"

        load_before = os.getloadavg()
        with web_server(env) as base_url:
            ws_base = base_url.replace("http://", "ws://")
            clients = [SocketClient(f"{ws_base}/ws/stacks/{stacks[i % len(stacks)].slug}/", base_url, cookie)
                       for i in range(args.ws_clients)]
            for client in clients:
                client.start()
            for client in clients:
                if not client.ready.wait(30):
                    raise RuntimeError("a websocket client did not connect")

            from playwright.sync_api import sync_playwright

            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"  # Playwright's loop runs on this thread
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                context = browser.new_context()
                context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": session,
                                      "url": base_url}])
                pages = []
                log(f"opening {args.pages} student pages on {len(stacks)} stacks")
                for i in range(args.pages):
                    page = context.new_page()
                    page.goto(f"{base_url}/dashboard/students/{stacks[i % len(stacks)].slug}/")
                    page.locator('[data-live-status="connected"]').wait_for(timeout=30_000)
                    page.evaluate(OBSERVER_JS)
                    pages.append(page)

                committed: dict[str, float] = {}
                stack_of: dict[str, int] = {}

                def write(n: int, stamp: bool) -> None:
                    index = n % len(stacks)
                    moment: list[float] = []
                    with transaction.atomic():
                        transaction.on_commit(lambda: moment.append(time.time()))  # runs first after commit
                        memory = memory_create(stack=stacks[index], kind="note",
                                               payload={"content": f"Live bench memory {n}"}, source="api")
                    if stamp:
                        committed[str(memory.pk)] = moment[0]
                        stack_of[str(memory.pk)] = index

                for n in range(len(stacks)):  # warm-up: every page renders a row once, not measured
                    write(n, stamp=False)
                time.sleep(2)
                log(f"{args.writes} writes, {args.interval:.2f} s apart")
                for n in range(args.writes):
                    write(len(stacks) + n, stamp=True)
                    # Playwright dispatches page events only while it is called: a short wait, not sleep.
                    pages[0].wait_for_timeout(args.interval * 1000)
                pages[0].wait_for_timeout(3000)

                dom: list[float] = []
                missing_dom = 0
                for i, page in enumerate(pages):
                    arrived = page.evaluate("() => window.__arrived")
                    for memory_id, at in committed.items():
                        if stack_of[memory_id] != i % len(stacks):
                            continue
                        if f"memory-{memory_id}" in arrived:
                            dom.append(arrived[f"memory-{memory_id}"] - at * 1000)
                        else:
                            missing_dom += 1
                socket: list[float] = []
                missing_socket = 0
                for i, client in enumerate(clients):
                    for memory_id, at in committed.items():
                        if stack_of[memory_id] != i % len(stacks):
                            continue
                        if memory_id in client.arrived:
                            socket.append((client.arrived[memory_id] - at) * 1000)
                        else:
                            missing_socket += 1

                throughput = None
                if args.push_memories:
                    throughput = compare_pushes(env, base_url, secret, args.push_memories, args.batch, pages)
                browser.close()
            for client in clients:
                client.stop.set()
            for client in clients:
                client.join(5)
        load_after = os.getloadavg()

        rows = []
        for path, samples, missing in (("websocket client (floor)", socket, missing_socket),
                                       ("Chromium DOM (row inserted)", dom, missing_dom)):
            figures = percentiles(samples)
            rows.append({"path": path, "samples": figures["n"], "missing": missing, "p50 ms": figures["p50"],
                         "p95 ms": figures["p95"], "max ms": max(samples) if samples else float("nan")})
        print_table(f"commit -> client latency: {args.pages} pages + {args.ws_clients} sockets on {len(stacks)} "
                    f"stacks, {args.writes} writes", rows)
        if throughput is not None:
            on, off = throughput["on"], throughput["off"]
            on_lat, off_lat = percentiles(throughput["lat_on"]), percentiles(throughput["lat_off"])
            n = args.push_memories
            print_table(f"push {n:,} ops each, batches of {args.batch}, events on (pages watching) vs off", [
                {"server": "events on", "seconds": on, "ops/s": n / on, "x off": off / on,
                 "batch p50 ms": on_lat["p50"], "batch p95 ms": on_lat["p95"]},
                {"server": "MEMORYHUB_EVENTS=off", "seconds": off, "ops/s": n / off, "x off": 1.0,
                 "batch p50 ms": off_lat["p50"], "batch p95 ms": off_lat["p95"]},
            ])
        dom_p95 = percentiles(dom)["p95"]
        print(f"\ngoals: p95 to the DOM <= 250 ms -> {dom_p95:.0f} ms"
              + (f"; push with events >= 0.95x without -> {throughput['off'] / throughput['on']:.2f}x"
                 if throughput else ""))
        print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} (the machine is shared)")


def compare_pushes(env: Any, on_url: str, secret: str, memories: int, batch: int, pages: list[Any]) -> dict[str, Any]:
    """Alternate pushes between the events-on server (whose pages stay open; the pushed stack is
    watched by the first page, so each push is rendered and sent) and an events-off server."""
    watched = pages[0].url.rstrip("/").rsplit("/", 1)[-1]
    on_ops = make_operations(memories, seed=5, stack_slug=watched)
    off_ops = make_operations(memories, seed=6, stack_slug="push-off")
    result: dict[str, Any] = {"on": 0.0, "off": 0.0, "lat_on": [], "lat_off": []}
    with web_server(env, extra_env={"MEMORYHUB_EVENTS": "off"}) as off_url:
        http_push(off_url, secret, "push-off", make_operations(batch, seed=97, stack_slug="push-off"), batch)
        log(f"pushing {memories:,} operations to each server, alternating")
        for start in range(0, memories, batch):
            for side, url, slug, ops in (("on", on_url, watched, on_ops), ("off", off_url, "push-off", off_ops)):
                elapsed, latencies = http_push(url, secret, slug, ops[start:start + batch], batch)
                result[side] += elapsed
                result[f"lat_{side}"].extend(latencies)
    return result


if __name__ == "__main__":
    main()
