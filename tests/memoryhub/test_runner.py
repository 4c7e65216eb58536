"""`make run`'s runner, for real: embedded servers, web, worker and beat as child processes."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psutil
import psycopg
import pytest
from celery import Celery

from memoryhub.cpu_cgroup import autogroup_on, cpu_cgroup_path, root_cpu_cgroup
from memoryhub.embedded import free_port
from tests.conftest import shared_static_root

BASE_DIR = Path(__file__).resolve().parents[2]


def _wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except (httpx.HTTPError, OSError):
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def _readyz(base_url: str) -> httpx.Response:
    return httpx.get(f"{base_url}/readyz", timeout=10)


def _processes_using(data_dir: Path, ports: list[int]) -> list[str]:
    """Every live process whose command line names our data dir or one of our ports."""
    needles = [str(data_dir)] + [str(p) for p in ports]
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if proc.info["status"] == psutil.STATUS_ZOMBIE or "pytest" in cmdline:
            continue
        if any(needle in cmdline for needle in needles):
            found.append(f"{proc.info['pid']}: {cmdline}")
    return found


def _cpu_cgroups(runner_pid: int) -> set[str]:
    """The CPU cgroups of the runner and of every process under it still running: a backend whose
    connection just closed may be gone between the listing and the read."""
    paths = {cpu_cgroup_path(runner_pid)}
    for process in psutil.Process(runner_pid).children(recursive=True):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            paths.add(cpu_cgroup_path(process.pid))
    return paths


def _start_runner(env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    log = open(log_path, "ab")  # noqa: SIM115 - the child owns it until it exits
    return subprocess.Popen([sys.executable, "-m", "memoryhub.runner"], cwd=BASE_DIR, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.long
@pytest.mark.slow
def test_runner_serves_recovers_from_redis_death_and_stops_everything(tmp_path: Path) -> None:
    data_dir = tmp_path / "var"
    web_port, pg_port, redis_port = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(MEMORYHUB_DATA_DIR=str(data_dir), PORT=str(web_port), MEMORYHUB_PG_PORT=str(pg_port),
               MEMORYHUB_REDIS_PORT=str(redis_port), MEMORYHUB_ANVIL_PORT=str(free_port()),
               EMBEDDING_PROVIDER="hash", CELERY_CONCURRENCY="1", MEMORYHUB_STATIC_ROOT=shared_static_root())
    base_url = f"http://127.0.0.1:{web_port}"
    log_path = tmp_path / "runner.log"
    runner = _start_runner({**env, "RUNNER_CPU_CGROUP": "true"}, log_path)
    try:
        _wait_for(lambda: _readyz(base_url).status_code == 200, 180, "readyz 200")
        checks = _readyz(base_url).json()["checks"]
        assert {name: check["ok"] for name, check in checks.items()} == {
            "database": True, "redis": True, "celery": True}

        # The lock timeout is the web processes' alone (docs/operations.md §6 "Lock waits").
        parts: dict[psutil.Process, str] = {}
        for child in psutil.Process(runner.pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):  # a backend may end between the two calls
                parts[child] = " ".join(child.cmdline())
        webs = [child for child, cmdline in parts.items() if "uvicorn" in cmdline]
        workers = [child for child, cmdline in parts.items() if "celery" in cmdline and " worker " in cmdline]
        assert webs and workers
        assert {child.environ().get("DB_LOCK_TIMEOUT_MS") for child in webs} == {"10000"}
        assert {child.environ().get("DB_LOCK_TIMEOUT_MS") for child in workers} == {None}

        # Asked to, under autogroup, as root in the root CPU cgroup, everything runs in a cgroup of
        # the runner's own, where niceness counts (memoryhub.cpu_cgroup); elsewhere nothing moves.
        cgroups = root_cpu_cgroup()
        moved = autogroup_on() and os.geteuid() == 0 and cgroups is not None
        expected = f"/memoryhub-{runner.pid}" if moved else cpu_cgroup_path()
        assert _cpu_cgroups(runner.pid) == {expected}

        redis_url = f"redis://127.0.0.1:{redis_port}/0"
        # Not the current app: later tests in this process send through memoryhub's (current_app).
        celery = Celery(broker=redis_url, backend=redis_url, set_as_current=False)
        assert celery.send_task("memoryhub.ping").get(timeout=30) == "pong"

        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{pg_port}/memoryhub", autocommit=True) as conn:
            # A table of the test's own: what must survive the restart is the data, whatever the schema.
            conn.execute("CREATE TABLE runner_keepme (name text)")
            conn.execute("INSERT INTO runner_keepme VALUES ('Kept')")

        redis_pid = next(p.pid for p in psutil.process_iter(["cmdline"])
                         if f"127.0.0.1:{redis_port}" in " ".join(p.info["cmdline"] or []))
        os.kill(redis_pid, signal.SIGKILL)
        _wait_for(lambda: _readyz(base_url).status_code == 503, 10, "readyz 503 after killing redis")
        body = _readyz(base_url).json()
        if body["checks"]["redis"]["ok"] is False:  # the supervisor may already have restarted it
            assert "redis" in body["failing"]
        assert httpx.get(f"{base_url}/health", timeout=5).status_code == 200
        _wait_for(lambda: _readyz(base_url).status_code == 200, 90, "recovery after redis restart")
        # The outage shows in the log as a warning naming what failed; a probe's 503 is no
        # server error (neither during it nor during start-up).
        log_text = log_path.read_text()
        assert re.search(r"WARNING memoryhub\.views \[[^\]]+\]: not ready: ", log_text)
        assert "ERROR django.request" not in log_text
    finally:
        os.killpg(runner.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        runner.wait(90)
    assert runner.returncode == 0, log_path.read_text()[-3000:]
    assert _processes_using(data_dir, [web_port, pg_port, redis_port]) == []
    assert "stopped; data kept" in log_path.read_text()
    if moved:
        assert cgroups is not None and not (cgroups / f"memoryhub-{runner.pid}").exists()

    # A second start reuses the data. Not asked to, the runner moves nothing into a cgroup.
    runner = _start_runner({k: v for k, v in env.items() if k != "RUNNER_CPU_CGROUP"}, log_path)
    try:
        _wait_for(lambda: _readyz(base_url).status_code == 200, 180, "readyz 200 on second start")
        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{pg_port}/memoryhub") as conn:
            assert conn.execute("SELECT name FROM runner_keepme").fetchone() == ("Kept",)
        assert _cpu_cgroups(runner.pid) == {cpu_cgroup_path()}
    finally:
        os.killpg(runner.pid, signal.SIGTERM)
        runner.wait(90)
    assert runner.returncode == 0
    assert _processes_using(data_dir, [web_port, pg_port, redis_port]) == []
