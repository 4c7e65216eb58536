"""Recovery after a part dies: the runner's restart back-off starts over after a healthy run, and a
503 tells clients to come back when the part is likely back (seconds), not in a flat minute."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from django.db import OperationalError
from rest_framework.test import APIRequestFactory

from memoryhub import outage
from memoryhub.embedded import ManagedProcess
from memoryhub.errors import api_exception_handler
from memoryhub.runner import HEALTHY_RUN_SECONDS, Supervisor


def wait_exit(child: ManagedProcess) -> None:
    deadline = time.monotonic() + 10
    while child.running() and time.monotonic() < deadline:
        time.sleep(0.02)


def next_delay(supervisor: Supervisor, child: ManagedProcess) -> float:
    """Let the child die, then the delay the supervisor chose for its restart."""
    wait_exit(child)
    before = time.monotonic()
    supervisor.watch_once()
    return round(supervisor.restart_at[child.name] - before)


def restart_now(supervisor: Supervisor, child: ManagedProcess) -> None:
    supervisor.restart_at[child.name] = 0.0
    supervisor.watch_once()
    assert child.name not in supervisor.restart_at


def test_back_off_doubles_for_a_crash_loop_and_starts_over_after_a_healthy_run(tmp_path: Path) -> None:
    child = ManagedProcess(name="short", argv=[sys.executable, "-c", "pass"], log_path=tmp_path / "child.log")
    supervisor = Supervisor()
    supervisor.add(child)
    try:
        assert next_delay(supervisor, child) == 1
        restart_now(supervisor, child)
        assert next_delay(supervisor, child) == 2  # died again at once: a crash loop backs off
        restart_now(supervisor, child)
        assert next_delay(supervisor, child) == 4
        restart_now(supervisor, child)
        # This run was healthy (as if it had lived past HEALTHY_RUN_SECONDS): back to 1 s.
        supervisor.started_at[child.name] -= HEALTHY_RUN_SECONDS + 1
        assert next_delay(supervisor, child) == 1
    finally:
        supervisor.stop_all()


def test_retry_after_follows_the_outage_length_with_jitter() -> None:
    part = "test-part"
    first = outage.retry_after_seconds(part, now=1000.0)
    assert 1 <= first <= 3  # a fresh outage: come back in a couple of seconds, not a minute
    later = outage.retry_after_seconds(part, now=1010.0)  # down for 10 s so far
    assert 8 <= later <= 12
    capped = [outage.retry_after_seconds(part, now=1000.0 + t) for t in range(20, 300, 9)]
    assert max(capped) <= 36 and len(set(capped)) > 1  # capped at 30 s ± 20 %, and spread
    assert outage.retry_after_seconds(part, now=2000.0) <= 3  # after a quiet gap, a new outage


@pytest.mark.parametrize("failures", [1, 5])
def test_a_database_outage_503_says_retry_in_seconds(failures: int) -> None:
    outage._outages.clear()
    request = APIRequestFactory().get("/api/v1/stacks/")
    for _ in range(failures):
        response = api_exception_handler(OperationalError("connection refused"), {"request": request})
    assert response is not None and response.status_code == 503
    assert 1 <= int(response["Retry-After"]) <= 3


def test_periodic_runs_have_their_own_queue_which_the_worker_consumes(celery_worker: object) -> None:
    from memoryhub.celery import app
    from memoryhub.schedule import PERIODIC_QUEUE

    assert app.conf.beat_schedule, "no periodic jobs"
    assert {entry["options"]["queue"] for entry in app.conf.beat_schedule.values()} == {PERIODIC_QUEUE}
    consumed = {}
    for _ in range(4):  # a broadcast's reply can miss its 5 s on a busy 2-core box: ask again
        consumed = app.control.inspect(timeout=5).active_queues() or {}
        if consumed:
            break
    assert any({q["name"] for q in queues} >= {"celery", PERIODIC_QUEUE} for queues in consumed.values())
    # A periodic task sent the way beat sends it is run by the worker from that queue.
    result = app.send_task("memoryhub.ping", queue=PERIODIC_QUEUE)
    assert result.get(timeout=30) == "pong"


DRAINING_CHILD = """
import pathlib, signal, sys, time
def drain(signum, frame):
    time.sleep(0.5)  # finishing what is in flight
    pathlib.Path(sys.argv[1]).write_text("drained")
    sys.exit(0)
signal.signal(signal.SIGTERM, drain)
pathlib.Path(sys.argv[1] + ".ready").write_text("up")
while True:
    time.sleep(0.05)
"""


@pytest.mark.parametrize(("stop_timeout", "drained"), [(5.0, True), (0.1, False)])
def test_a_stopped_child_may_finish_its_work_within_its_stop_timeout(tmp_path: Path, stop_timeout: float,
                                                                    drained: bool) -> None:
    marker = tmp_path / "marker"
    child = ManagedProcess(name="draining", argv=[sys.executable, "-c", DRAINING_CHILD, str(marker)],
                           stop_timeout=stop_timeout)
    child.start()
    deadline = time.monotonic() + 10
    while not (tmp_path / "marker.ready").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    child.stop()  # SIGTERM, then SIGKILL once stop_timeout has passed
    assert not child.running()
    assert marker.exists() is drained
