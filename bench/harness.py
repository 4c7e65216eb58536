"""Shared machinery for the benchmarks in bench/.

Every benchmark prints its own figures next to a baseline measured in the same run (the machine
is noisy; ratios hold). This module gives them:

* `bench_environment(name)` — real embedded PostgreSQL+pgvector and Redis in a throw-away
  directory (or DATABASE_URL / REDIS_URL when set), migrated, with Django set up in-process;
* `web_server(env)` — the real ASGI app under uvicorn in a subprocess, for over-HTTP figures;
* `percentiles`, `print_table` — the figures;
* `Machine` — the state of the machine a run measured on: how much of its CPU time the hypervisor
  took (steal) and how fast one core ran a fixed loop before and after, so a slow hour can be told
  apart from slow code (docs/benchmarks.md "Machines and hours").

The synthetic stacks and memories they load are bench/synthetic.py's.

Run a benchmark as `.venv/bin/python bench/<name>.py [--help]`.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
if str(BASE_DIR) not in sys.path:
    sys.path.insert(0, str(BASE_DIR))

from memoryhub.embedded import EmbeddedPostgres, EmbeddedRedis, ManagedProcess, free_port  # noqa: E402


@dataclass
class BenchEnv:
    database_url: str
    redis_url: str
    workdir: Path

    def subprocess_env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ, DATABASE_URL=self.database_url, REDIS_URL=self.redis_url)
        env.update(extra)
        return env


def log(message: str) -> None:
    print(f"[bench] {message}", flush=True)


@contextmanager
def bench_environment(name: str, *, keep: bool = False, data_dir: Path | None = None) -> Iterator[BenchEnv]:
    """Start (or reuse from the environment) Postgres and Redis, migrate, and set up Django.

    With `data_dir` the embedded servers live there and are kept after the run, so a benchmark
    whose load takes tens of minutes can measure the same data again (see bench/search.py)."""
    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
        keep = True
    workdir = data_dir.resolve() if data_dir is not None else Path(tempfile.mkdtemp(prefix=f"memoryhub-bench-{name}-"))
    started: list[EmbeddedPostgres | EmbeddedRedis] = []
    try:
        database_url = os.environ.get("DATABASE_URL", "")
        redis_url = os.environ.get("REDIS_URL", "")
        if not database_url:
            postgres = EmbeddedPostgres(workdir / "postgres", free_port(), log_path=workdir / "postgres.log")
            postgres.process.argv += [
                "-c",
                # An HNSW build (a large stack's own graph, bench/search.py) spills to on-disk
                # inserts below its graph's size and then takes far longer.
                "maintenance_work_mem=4GB",
                "-c",
                "max_wal_size=8GB",
                "-c",
                "checkpoint_timeout=30min",
                "-c",
                "work_mem=64MB",
            ]
            postgres.prepare()
            postgres.start()
            started.append(postgres)
            postgres.ensure_database("memoryhub_bench")
            database_url = postgres.url("memoryhub_bench")
        if not redis_url:
            redis_server = EmbeddedRedis(workdir / "redis", free_port(), log_path=workdir / "redis.log")
            redis_server.prepare()
            redis_server.start()
            started.append(redis_server)
            redis_url = redis_server.url()
        os.environ["DATABASE_URL"] = database_url
        os.environ["REDIS_URL"] = redis_url
        os.environ.setdefault("EMBEDDING_PROVIDER", "hash")
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memoryhub.settings")
        log(f"migrating {database_url}")
        subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=BASE_DIR, check=True)
        import django

        django.setup()
        yield BenchEnv(database_url=database_url, redis_url=redis_url, workdir=workdir)
    finally:
        for server in reversed(started):
            server.stop()
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)


@contextmanager
def web_server(env: BenchEnv, *, workers: int = 1, extra_env: dict[str, str] | None = None,
               app: str = "memoryhub.asgi:application", factory: bool = False) -> Iterator[str]:
    """The real ASGI app under uvicorn; yields its base URL once /health answers. `app` (with
    `factory` when it names a callable returning the app) serves a variant next to it, e.g. a
    baseline in the same run."""
    import httpx

    port = free_port()
    server = ManagedProcess(
        name="web",
        argv=[
            sys.executable,
            "-m",
            "uvicorn",
            app,
            *(["--factory"] if factory else []),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            str(workers),
            # Named, not "auto": a missing uvloop/httptools then fails here instead of silently
            # benchmarking the slower pure-Python loop and parser.
            "--loop",
            "uvloop",
            "--http",
            "httptools",
            "--no-access-log",
            "--lifespan",
            "off",
            "--log-level",
            "warning",
        ],
        env=env.subprocess_env(**(extra_env or {})),
        cwd=BASE_DIR,
        log_path=env.workdir / "web.log",
    )
    server.start()
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        while True:
            if not server.running():
                raise RuntimeError("web server died:\n" + (env.workdir / "web.log").read_text()[-4000:])
            try:
                if httpx.get(f"{base_url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("web server did not start in 60 s")
            time.sleep(0.2)
        yield base_url
    finally:
        server.stop()


def percentiles(samples_ms: Sequence[float]) -> dict[str, float]:
    ordered = sorted(samples_ms)
    if not ordered:
        return {"n": 0, "p50": math.nan, "p95": math.nan, "p99": math.nan, "mean": math.nan}

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]

    return {
        "n": len(ordered),
        "p50": pick(0.50),
        "p95": pick(0.95),
        "p99": pick(0.99),
        "mean": sum(ordered) / len(ordered),
    }


def print_listed(title: str, lines: Sequence[str], most: int) -> None:
    """"title: N", then the first `most` of the lines, indented."""
    print(f"{title}: {len(lines)}" + "".join(f"\n  {line}" for line in lines[:most]))


def print_table(title: str, rows: Sequence[dict[str, Any]]) -> None:
    """A plain fixed-width table; floats with 2 decimals."""
    print(f"\n== {title}")
    if not rows:
        print("(no rows)")
        return
    headers = list(rows[0].keys())

    def fmt(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:,.2f}"
        if isinstance(value, int):
            return f"{value:,}"
        return str(value)

    cells = [[fmt(row.get(h, "")) for h in headers] for row in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    for c in cells:
        print("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)))
    sys.stdout.flush()


# A fixed piece of pure-Python work: what one core of this machine takes for it now.
_PROBE_RANGE = 300_000


def speed_probe_ms(runs: int = 7) -> float:
    """Median milliseconds of a fixed pure-Python loop on this process's thread (lower is faster)."""
    import statistics

    timings = []
    for _ in range(runs):
        started = time.thread_time()
        total = 0
        for n in range(_PROBE_RANGE):
            total += n * n % 7
        timings.append((time.thread_time() - started) * 1000)
    return statistics.median(timings)


@dataclass
class Machine:
    """Readings of the whole machine around a measured span: `start()` before it, `stop()` after,
    then `line()` for the report. The probe runs with the load off (before and after the span), so
    it reads the machine, not the service's own load on it."""

    probe_before_ms: float = 0.0
    probe_after_ms: float = 0.0
    cpu_before: Any = None
    cpu_after: Any = None

    def start(self) -> None:
        import psutil

        self.probe_before_ms = speed_probe_ms()
        self.cpu_before = psutil.cpu_times()

    def stop(self) -> None:
        import psutil

        self.cpu_after = psutil.cpu_times()
        self.probe_after_ms = speed_probe_ms()

    def shares(self) -> dict[str, float]:
        """Of all the machine's CPU time during the span: what the hypervisor took (steal), what
        ran (busy: this run and anything else on the machine) and what was idle."""
        delta = {name: getattr(self.cpu_after, name) - getattr(self.cpu_before, name)
                 for name in self.cpu_before._fields if name not in ("guest", "guest_nice")}
        total = sum(delta.values()) or 1.0
        steal = delta.get("steal", 0.0)
        idle = delta.get("idle", 0.0) + delta.get("iowait", 0.0)
        return {"steal": steal / total, "busy": (total - steal - idle) / total, "idle": idle / total}

    def line(self) -> str:
        shares = self.shares()
        return (f"machine: the hypervisor took {shares['steal']:.1%} of the CPU time (steal), "
                f"{shares['busy']:.1%} ran, {shares['idle']:.1%} idle; one core's speed probe "
                f"{self.probe_before_ms:.1f} ms before and {self.probe_after_ms:.1f} ms after "
                "(a fixed pure-Python loop, lower is faster)")
