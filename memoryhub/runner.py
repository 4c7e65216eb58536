"""`make run`: start the whole service on one machine and stop all of it on Ctrl-C / SIGTERM.

Unless DATABASE_URL / REDIS_URL point at external servers, this starts embedded PostgreSQL
(+pgvector) and Redis with data under MEMORYHUB_DATA_DIR (default ./var) and records them in
DATA_DIR/runtime.json, so `manage.py …` in another shell finds them (memoryhub/settings.py). It
then migrates, collects the static files, runs the ASGI server (HTTP + websockets), one Celery
worker and exactly one Celery beat, and says "up" with the URLs only once /readyz answers 200.
Every child is supervised: one that dies is restarted with back-off, and on shutdown everything
this process started is stopped, in reverse order, and the runtime file removed, before it exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from memoryhub.chain_dev import chain_lines, run_dev_chain, write_chain_file
from memoryhub.cpu_cgroup import autogroup_on, enter_own_cpu_cgroup, leave_cpu_cgroup
from memoryhub.embedded import EmbeddedPostgres, EmbeddedRedis, ManagedProcess, port_open
from memoryhub.embedding_hold import hold_writer
from memoryhub.redis_marks import mark_reader
from memoryhub.schedule import WORKER_QUEUES
from memoryhub.worker_priority import BULK_QUEUED_KEY, PRESSURE_KEY, WorkerPriority, equal_share_nice

BASE_DIR = Path(__file__).resolve().parent.parent
MAX_BACKOFF_SECONDS = 30.0
# A child that ran this long before it died was healthy: its next restart starts again at 1 s
# (without this, rare kills far apart still climbed the back-off, and the API answered 503 meanwhile).
HEALTHY_RUN_SECONDS = 60.0
# Graceful shutdown (SIGTERM / Ctrl-C): how long the web server drains requests in flight and the
# worker finishes its running tasks before they are killed.
GRACEFUL_WEB_SECONDS = 20.0
# How long a web process keeps an idle kept-alive connection open. Longer than clients keep theirs
# (httpx 5 s): a server that closes first can close a connection just as a client sends its next
# request into it, which then gets no answer (docs/operations.md §6, "Timeouts a slow or hostile
# client meets").
WEB_KEEP_ALIVE_SECONDS = 30
GRACEFUL_WORKER_SECONDS = 60.0
# From "web, worker and beat started" to /readyz 200. A first start imports torch and Django in
# three processes at once, which is slow on a busy small machine: a wide margin.
READY_TIMEOUT_SECONDS = 180.0
# The worker's CPU niceness while embedding keeps up (`WORKER_CPU_NICE`), and how far behind it may
# fall before it competes for the cores as an equal again (`EMBEDDING_CATCH_UP_SECONDS`, 0: never;
# memoryhub.worker_priority, docs/operations.md §8).
DEFAULT_WORKER_CPU_NICE = 10
DEFAULT_EMBEDDING_CATCH_UP_SECONDS = 60
# How far behind embedding may wait out a flood of bulk work (`EMBEDDING_HOLD_SECONDS`; 0: never
# waits, the worker only yields; memoryhub.embedding_hold, docs/operations.md §8).
DEFAULT_EMBEDDING_HOLD_SECONDS = 900
# A web request's statements wait at most this long for a lock (docs/operations.md §6 "Lock waits").
DEFAULT_WEB_LOCK_TIMEOUT_MS = 10_000


# Connections kept free of the pools' budget: `manage.py` commands, backups, beat, the health
# checks, an operator's psql.
RESERVED_CONNECTIONS = 20
POOL_CEILING = 10  # per web process: one GIL-bound process keeps ~10 requests in the database at most
WORKER_CONNECTIONS = 2  # per worker child: it runs one task at a time (plus the outbox's thread)


def machine_cores() -> int:
    """Cores this process may run on (a container's CPU set, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_web_workers(cores: int, *, database_here: bool) -> int:
    """Web processes for `cores`: one per core with the database elsewhere. With the database on
    this machine, half the cores, but never fewer than two when there are two: a Python process
    runs one request's Python at a time, so in a single process one long request (a 500-operation
    push, a school-wide search) makes every request behind it wait, while two processes let the OS
    share the cores. On 2 cores two processes give a lower p95 at the agents' pace for a slightly
    lower peak under closed-loop load (the soak figures: docs/production.md §2)."""
    if not database_here:
        return cores
    return min(cores, max(2, cores // 2))


def sized_pool(max_connections: int, web_workers: int, concurrency: int) -> int:
    """DB_POOL_MAX_SIZE for each process so that every pool at its fullest still fits in the
    server's max_connections (docs/production.md §2): web processes share what the worker
    children and the reserve leave, at most POOL_CEILING each, at least 2."""
    budget = max_connections - RESERVED_CONNECTIONS - WORKER_CONNECTIONS * concurrency
    return max(2, min(POOL_CEILING, budget // max(web_workers, 1)))


def server_max_connections(database_url: str) -> int:
    """The database server's max_connections (PostgreSQL's default 100 when it cannot be read)."""
    import psycopg

    try:
        with psycopg.connect(database_url, connect_timeout=5) as conn:
            row = conn.execute("SHOW max_connections").fetchone()
        return int(row[0]) if row else 100
    except (psycopg.Error, ValueError):
        return 100


def log(message: str) -> None:
    print(f"[memoryhub] {message}", flush=True)


class Supervisor:
    """Keeps a list of children alive; restarts a dead one with exponential back-off."""

    def __init__(self) -> None:
        self.children: list[ManagedProcess] = []
        self.backoff: dict[str, float] = {}
        self.restart_at: dict[str, float] = {}
        self.started_at: dict[str, float] = {}
        self.stopping = False

    def add(self, child: ManagedProcess) -> None:
        child.start()
        self.started_at[child.name] = time.monotonic()
        log(f"started {child.name} (pid {child.pid})")
        self.children.append(child)

    def watch_once(self) -> None:
        now = time.monotonic()
        for child in self.children:
            if child.running():
                continue
            if child.name not in self.restart_at:
                forget_live_metrics(child.pid)
                if now - self.started_at.get(child.name, now) >= HEALTHY_RUN_SECONDS:
                    self.backoff.pop(child.name, None)
                delay = self.backoff.get(child.name, 1.0)
                log(f"{child.name} exited with code {child.returncode()}; restarting in {delay:.0f}s")
                self.restart_at[child.name] = now + delay
                self.backoff[child.name] = min(delay * 2, MAX_BACKOFF_SECONDS)
            elif now >= self.restart_at[child.name]:
                del self.restart_at[child.name]
                child.stop(timeout=1)
                child.start()
                self.started_at[child.name] = time.monotonic()
                log(f"restarted {child.name} (pid {child.pid})")

    def stop_all(self) -> None:
        for child in reversed(self.children):
            log(f"stopping {child.name}")
            child.stop()


def forget_live_metrics(pid: int | None) -> None:
    """A dead process's live gauges (open websockets) no longer count in /metrics (memoryhub.metrics)."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if pid and directory:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, directory)


def write_runtime_file(path: Path, info: dict[str, Any]) -> None:
    """Atomically: a command reading it never sees half a file."""
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(info, indent=2) + "\n")
    os.replace(partial, path)


def probe_readyz(base_url: str) -> tuple[int, list[str]]:
    """(HTTP status of /readyz, the failing parts with their detail); (0, [why]) while nothing answers."""
    try:
        with urllib.request.urlopen(f"{base_url}/readyz", timeout=5) as response:  # noqa: S310 - our own URL
            return response.status, []
    except urllib.error.HTTPError as exc:
        try:
            body = json.loads(exc.read())
            failing = [f"{name} ({body['checks'][name]['detail']})" for name in body["failing"]]
        except (ValueError, KeyError, TypeError):
            failing = [f"HTTP {exc.code}"]
        return exc.code, failing
    except OSError as exc:  # refused, reset, timed out (URLError is an OSError too)
        return 0, [f"web server ({getattr(exc, 'reason', exc)})"]


def wait_until_ready(supervisor: Supervisor, base_url: str, timeout: float) -> str | None:
    """Poll /readyz (restarting children that die meanwhile); None once it is 200, else why not."""
    deadline = time.monotonic() + timeout
    shown: list[str] | None = None
    failing: list[str] = []
    while time.monotonic() < deadline and not supervisor.stopping:
        supervisor.watch_once()
        status, failing = probe_readyz(base_url)
        if status == 200:
            return None
        if failing != shown:  # say what it waits for when that changes, not every half second
            log("waiting for " + ", ".join(failing))
            shown = failing
        time.sleep(0.5)
    return ", ".join(failing) or "stopped"


def up_message(base_url: str, seconds: float, runtime: Path | None) -> list[str]:
    """What the newcomer reads: every URL here answers 200 (tests/memoryhub/test_first_hour.py)."""
    lines = [
        f"MemoryHub is up (ready in {seconds:.0f}s):",
        f"  dashboard  {base_url}/   (sign in; `manage.py create_school` makes the first account)",
        f"  API docs   {base_url}/api/docs/   (OpenAPI schema {base_url}/api/schema/)",
        f"  admin      {base_url}/admin/",
        f"  readiness  {base_url}/readyz",
    ]
    if runtime is not None:
        lines.append(f"`.venv/bin/python manage.py …` in another shell uses this service (it reads {runtime}).")
    lines.append("Ctrl-C stops everything.")
    return lines


def main() -> int:
    from django.core.exceptions import ImproperlyConfigured

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memoryhub.settings")
    try:
        from memoryhub.environment import (
            data_dir,
            env_bool,
            env_int,
            env_str,
            running_service,
            runtime_file,
            static_root,
        )

        data = data_dir()
        host = env_str("HOST", "127.0.0.1")
        port = env_int("PORT", 8000, minimum=1, maximum=65535)
        pg_port = env_int("MEMORYHUB_PG_PORT", 54320, minimum=1, maximum=65535)
        redis_port = env_int("MEMORYHUB_REDIS_PORT", 63790, minimum=1, maximum=65535)
        anvil_port = env_int("MEMORYHUB_ANVIL_PORT", 58545, minimum=1, maximum=65535)
        # Base makes a block every 2 s: payments in development reach their confirmations the same way.
        anvil_block_time = env_int("ANVIL_BLOCK_TIME", 2, minimum=1)
        # Sized to the machine (docs/production.md §2): web processes for the web's share of
        # the cores and a worker process per core (embedding is CPU-bound).
        cores = machine_cores()
        web_workers = env_int("WEB_WORKERS", default_web_workers(cores, database_here=not os.environ.get(
            "DATABASE_URL")), minimum=1)
        concurrency = env_int("CELERY_CONCURRENCY", cores, minimum=1)
        worker_nice = env_int("WORKER_CPU_NICE", DEFAULT_WORKER_CPU_NICE, minimum=0, maximum=19)
        worker_idle = env_bool("WORKER_CPU_IDLE", True)
        catch_up_seconds = env_int("EMBEDDING_CATCH_UP_SECONDS", DEFAULT_EMBEDDING_CATCH_UP_SECONDS, minimum=0)
        hold_seconds = env_int("EMBEDDING_HOLD_SECONDS", DEFAULT_EMBEDDING_HOLD_SECONDS, minimum=0)
        web_lock_timeout_ms = env_int("DB_LOCK_TIMEOUT_MS", DEFAULT_WEB_LOCK_TIMEOUT_MS, minimum=0)
        own_cpu_cgroup = env_bool("RUNNER_CPU_CGROUP", False)
        import memoryhub.settings  # noqa: F401  (validates every setting before anything starts)
    except ImproperlyConfigured as exc:
        log(f"configuration error: {exc}")
        return 2

    # Where the service is reached (the printed URLs, the readiness poll): a wildcard address is
    # reached through loopback.
    shown_host = "127.0.0.1" if host in ("0.0.0.0", "::") else host  # noqa: S104 - display only
    base_url = f"http://[{shown_host}]:{port}" if ":" in shown_host else f"http://{shown_host}:{port}"
    other = running_service(data)
    if other:
        log(f"MemoryHub is already running from {data} (pid {other['pid']}, {other.get('web_url')}); "
            "stop it first, or give this one its own MEMORYHUB_DATA_DIR and ports")
        return 1
    if ":" not in shown_host and port_open(port, shown_host):  # port_open speaks IPv4
        log(f"port {port} is already in use; set PORT to another port")
        return 1

    data.mkdir(parents=True, exist_ok=True)
    logs = data / "logs"
    runtime = runtime_file(data)
    env = dict(os.environ)  # EMBEDDING_PROVIDER included: every child reads the same one (settings)
    # The lock timeout is the web's alone: the worker's jobs and the migrations may wait on purpose.
    env.pop("DB_LOCK_TIMEOUT_MS", None)
    # Prometheus metrics of every web and worker process, added up by /metrics (memoryhub.metrics);
    # emptied at each start, as the client library requires (old processes' files would count).
    metrics_dir = Path(env.setdefault("PROMETHEUS_MULTIPROC_DIR", str(data / "metrics")))
    shutil.rmtree(metrics_dir, ignore_errors=True)
    metrics_dir.mkdir(parents=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)  # for forget_live_metrics here
    supervisor = Supervisor()
    wrote_runtime = False

    def request_stop(signum: int, frame: FrameType | None) -> None:
        supervisor.stopping = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    # First, so that everything started below is in it too (memoryhub.cpu_cgroup).
    cpu_cgroup = enter_own_cpu_cgroup() if own_cpu_cgroup else None
    if cpu_cgroup is not None:
        log(f"the service's processes run in the CPU cgroup {cpu_cgroup.name}, each weighed by its "
            "niceness rather than its session's autogroup (docs/production.md §3)")

    try:
        recorded: dict[str, Any] = {"pid": os.getpid(), "data_dir": str(data), "web_url": base_url,
                                    "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
                                    "database_url": None, "redis_url": None}
        if not env.get("DATABASE_URL"):
            log(f"starting embedded PostgreSQL on 127.0.0.1:{pg_port}")
            postgres = EmbeddedPostgres(data / "postgres", pg_port, log_path=logs / "postgres.log")
            postgres.prepare()
            postgres.start()
            supervisor.children.append(postgres.process)
            postgres.ensure_database("memoryhub")
            env["DATABASE_URL"] = recorded["database_url"] = postgres.url("memoryhub")
            log(f"embedded PostgreSQL on 127.0.0.1:{pg_port} (data {postgres.pgdata})")
        else:
            log("using external PostgreSQL from DATABASE_URL")
        if not env.get("REDIS_URL"):
            redis_server = EmbeddedRedis(data / "redis", redis_port, log_path=logs / "redis.log")
            redis_server.prepare()
            redis_server.start()
            supervisor.children.append(redis_server.process)
            env["REDIS_URL"] = recorded["redis_url"] = redis_server.url()
            log(f"embedded Redis on 127.0.0.1:{redis_port} (data {redis_server.data_dir})")
        else:
            log("using external Redis from REDIS_URL")
        chain_lines_to_print: list[str] = []
        if not env.get("CHAIN_RPC_URL"):
            # The development chain (memoryhub/chain_dev.py): Anvil with the USDC-like token deployed
            # once (its state persists in the data dir) and recorded in chain.json for settings.
            anvil, dev_chain, deployed_now = run_dev_chain(data, anvil_port, block_time=anvil_block_time)
            supervisor.children.append(anvil.process)
            write_chain_file(data, dev_chain)
            log(f"embedded Anvil on 127.0.0.1:{anvil_port} (chain id {dev_chain.chain_id}; "
                f"{'deployed' if deployed_now else 'found'} TestUSDC at {dev_chain.usdc_contract})")
            chain_lines_to_print = chain_lines(dev_chain)
        else:
            log("using the payment chain from CHAIN_RPC_URL")
        # Only embedded servers are recorded (they need no password); an external URL stays in the
        # environment it came from and never lands in a file.
        if recorded["database_url"] or recorded["redis_url"]:
            write_runtime_file(runtime, recorded)
            wrote_runtime = True

        if not env.get("DB_POOL_MAX_SIZE"):
            env["DB_POOL_MAX_SIZE"] = str(sized_pool(server_max_connections(env["DATABASE_URL"]), web_workers,
                                                     concurrency))
        log(f"sizing: {web_workers} web process(es), worker concurrency {concurrency}, database pool "
            f"{env.get('DB_POOL_MAX_SIZE')} per process ({cores} cores)")
        python = sys.executable
        log("applying migrations")
        migrate = subprocess.run([python, "manage.py", "migrate", "--noinput"], cwd=BASE_DIR, env=env)
        if migrate.returncode != 0:
            log("migrations failed; stopping")
            return 1
        log(f"collecting static files into {static_root(data)}")
        collect = subprocess.run([python, "manage.py", "collectstatic", "--noinput", "--verbosity", "0"],
                                 cwd=BASE_DIR, env=env, capture_output=True, text=True)
        if collect.returncode != 0:
            sys.stdout.write(collect.stdout + collect.stderr)
            log("collectstatic failed; stopping")
            return 1
        if supervisor.stopping:
            return 0

        supervisor.add(ManagedProcess(
            name="web",
            argv=[python, "-m", "uvicorn", "memoryhub.asgi:application", "--host", host, "--port", str(port),
                  "--workers", str(web_workers), "--no-access-log",
                  # On: the MCP endpoint's session manager runs from lifespan startup to shutdown (memoryhub.asgi).
                  "--lifespan", "on",
                  "--loop", "uvloop", "--http", "httptools",
                  # The client address is decided by accounts.network from TRUSTED_PROXIES only; uvicorn
                  # would otherwise believe X-Forwarded-For from 127.0.0.1 itself (its default).
                  "--no-proxy-headers",
                  # Websocket frames larger than the guard's 64 Ki characters (memoryhub/limits.py, up to
                  # 4 bytes each in UTF-8) are refused by uvicorn before they are buffered.
                  "--ws-max-size", str(256 * 1024),
                  # SIGTERM: stop accepting, let requests in flight finish for up to this long.
                  "--timeout-graceful-shutdown", str(int(GRACEFUL_WEB_SECONDS)),
                  "--timeout-keep-alive", str(WEB_KEEP_ALIVE_SECONDS)],
            env=dict(env, DB_LOCK_TIMEOUT_MS=str(web_lock_timeout_ms)), cwd=BASE_DIR,
            stop_timeout=GRACEFUL_WEB_SECONDS + 5,
        ))
        worker = ManagedProcess(
            name="worker",
            argv=[python, "-m", "celery", "-A", "memoryhub", "worker", "--loglevel", "INFO",
                  "--concurrency", str(concurrency), "--hostname", "worker@%h", "--queues", WORKER_QUEUES],
            # SIGTERM is Celery's warm shutdown: running tasks finish (a task cut off by the SIGKILL
            # after this is redelivered: acks_late), no new one starts.
            env=env, cwd=BASE_DIR, stop_timeout=GRACEFUL_WORKER_SECONDS, cpu_nice=worker_nice,
        )
        supervisor.add(worker)
        if worker_nice and catch_up_seconds:
            # Weighed process by process, its pool's processes together catch up as one process would.
            weighed_alone = cpu_cgroup is not None or not autogroup_on()
            # (its thread ends with this process: it only ever changes the worker's niceness and policy
            # and the embedding hold, which lapses by itself)
            WorkerPriority(env["DATABASE_URL"], lambda: worker.pid if worker.running() else None, nice=worker_nice,
                           catch_up_seconds=catch_up_seconds, log=log,
                           requests_pressed=mark_reader(env["REDIS_URL"], PRESSURE_KEY), idle=worker_idle,
                           bulk_queued=mark_reader(env["REDIS_URL"], BULK_QUEUED_KEY),
                           equal_nice=equal_share_nice(concurrency) if weighed_alone else 0,
                           hold_seconds=hold_seconds, set_held=hold_writer(env["REDIS_URL"])).run_in_background()
        supervisor.add(ManagedProcess(
            name="beat",
            argv=[python, "-m", "celery", "-A", "memoryhub", "beat", "--loglevel", "INFO",
                  "--schedule", str(data / "celerybeat-schedule")],
            env=env, cwd=BASE_DIR,
        ))
        started = time.monotonic()
        not_ready = wait_until_ready(supervisor, base_url, READY_TIMEOUT_SECONDS)
        if supervisor.stopping:
            return 0
        if not_ready is not None:
            log(f"not ready after {READY_TIMEOUT_SECONDS:.0f}s, still failing: {not_ready}. The web, worker "
                f"and beat output is above; the embedded servers log to {logs}. Stopping.")
            return 1
        # The URLs first (each answers 200 to a browser), then the development chain's token,
        # treasury and demo wallets (its RPC URL answers JSON-RPC POSTs only).
        for line in up_message(base_url, time.monotonic() - started, runtime if wrote_runtime else None):
            log(line)
        for line in chain_lines_to_print:
            log(line)
        while not supervisor.stopping:
            supervisor.watch_once()
            time.sleep(0.5)
        return 0
    except Exception as exc:
        log(f"start-up failed: {exc}")
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        supervisor.stop_all()
        leave_cpu_cgroup(cpu_cgroup)
        if wrote_runtime:
            with contextlib.suppress(FileNotFoundError):
                runtime.unlink()
        log("stopped; data kept in " + str(data))


if __name__ == "__main__":
    sys.exit(main())
