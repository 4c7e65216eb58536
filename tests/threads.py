"""Threads for tests of first-use races: many at once, on an interpreter that hands the GIL over as
often as it can, as a busy web process's request threads do at its first requests. Standard library
only, so a test's fresh interpreter can use it too."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def busy_interpreter() -> Iterator[None]:
    """Two threads spinning and the switch interval at its least while the block runs."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    spinners = [threading.Thread(target=spin, daemon=True) for _ in range(2)]
    for spinner in spinners:
        spinner.start()
    try:
        yield
    finally:
        stop.set()
        for spinner in spinners:
            spinner.join()
        sys.setswitchinterval(interval)


def at_once(count: int, work: Callable[[], object]) -> list[object]:
    """`work` on `count` threads released together; what each returned or raised, in no order."""
    outcomes: list[object] = []
    start = threading.Barrier(count)

    def run() -> None:
        start.wait()
        try:
            outcomes.append(work())
        except Exception as error:  # what the thread met is the finding
            outcomes.append(error)

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes
