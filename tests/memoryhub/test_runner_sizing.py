"""The runner's default sizing and priorities (memoryhub/runner.py; docs/production.md §2)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from memoryhub.embedded import ManagedProcess
from memoryhub.runner import POOL_CEILING, RESERVED_CONNECTIONS, default_web_workers, sized_pool


def test_web_processes_get_half_the_cores_but_two_of_two_beside_the_database_and_all_without_it() -> None:
    assert [default_web_workers(n, database_here=True) for n in (1, 2, 3, 4, 16)] == [1, 2, 2, 2, 8]
    assert [default_web_workers(n, database_here=False) for n in (1, 2, 16)] == [1, 2, 16]


def test_every_pool_at_its_fullest_fits_in_max_connections() -> None:
    for max_connections in (20, 50, 100, 200, 500):
        for cores in (1, 2, 8, 32, 64):
            web, workers = default_web_workers(cores, database_here=False), cores
            pool = sized_pool(max_connections, web, workers)
            assert 2 <= pool <= POOL_CEILING
            if pool > 2:  # (below the floor the server is simply too small for the machine)
                assert web * pool + 2 * workers + RESERVED_CONNECTIONS <= max_connections
    assert sized_pool(200, 1, 2) == POOL_CEILING
    assert sized_pool(100, 32, 32) == 2


# The child reports its own niceness, that of a process it starts after a while (as the worker's pool
# processes are), and its session's scheduling-group niceness where the kernel has autogroup.
REPORT_NICENESS = """
import os, subprocess, sys, time
time.sleep(0.3)
child = subprocess.run([sys.executable, "-c", "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"],
                       capture_output=True, text=True, check=True).stdout.strip()
group = open("/proc/self/autogroup").read().split()[-1] if os.path.exists("/proc/self/autogroup") else "-"
print(os.getpriority(os.PRIO_PROCESS, 0), child, group, flush=True)
"""


def _niceness_of_child(tmp_path: Path, cpu_nice: int) -> list[str]:
    log = tmp_path / f"nice-{cpu_nice}.log"
    child = ManagedProcess(name="reporter", argv=[sys.executable, "-c", REPORT_NICENESS], log_path=log,
                           cpu_nice=cpu_nice)
    child.start()
    try:
        assert child.process is not None
        child.process.wait(30)
    finally:
        child.stop()
    return log.read_text().split()


def test_a_deprioritised_child_and_what_it_starts_later_run_at_its_niceness(tmp_path: Path) -> None:
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    own, started_later, group = _niceness_of_child(tmp_path, 7)
    assert (int(own), int(started_later)) == (max(ours, 7), max(ours, 7))
    # With autogroup every session is weighed alike whatever its processes' niceness: the group's
    # own niceness is what lowers its share against the web server's session.
    assert group in ("7", "-")
    # Without cpu_nice a child keeps our niceness and its session group the default.
    own, started_later, group = _niceness_of_child(tmp_path, 0)
    assert (int(own), int(started_later)) == (ours, ours)
    assert group in ("0", "-")
