"""What the service relies on from its PostgreSQL driver, psycopg (docs/benchmarks.md "Flood", the 500
of the first MiniLM flood)."""

from __future__ import annotations

import datetime
import sys
import threading
from collections.abc import Iterator

import pytest
from psycopg.adapt import AdaptersMap, PyFormat
from psycopg.types.datetime import DateDumper

THREADS = 8
ROUNDS = 400


@pytest.fixture
def busy_interpreter() -> Iterator[None]:
    """Threads that hand the GIL over as often as the interpreter allows, as a busy web process's
    request threads do at its first requests."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    spinners = [threading.Thread(target=spin, daemon=True) for _ in range(2)]
    for spinner in spinners:
        spinner.start()
    yield
    stop.set()
    for spinner in spinners:
        spinner.join()
    sys.setswitchinterval(interval)


@pytest.mark.usefixtures("busy_interpreter")
def test_threads_that_first_dump_a_type_at_once_all_find_its_dumper() -> None:
    """psycopg registers its date and time dumpers by name and puts the class in the name's place
    the first time one is asked for; before 3.3.2 another thread could look in between and find
    neither, and a push's counters (their day is a date) were answered 500 with "cannot adapt
    type 'date'". Every thread of every round must find the dumper."""
    failures: list[str] = []
    for _ in range(ROUNDS):
        adapters = AdaptersMap()
        adapters.register_dumper("datetime.date", DateDumper)
        start = threading.Barrier(THREADS)

        def first_dump(adapters: AdaptersMap = adapters, start: threading.Barrier = start) -> None:
            start.wait()
            try:
                adapters.get_dumper(datetime.date, PyFormat.TEXT)
            except Exception as error:  # whatever the driver raises is the finding
                failures.append(f"{type(error).__name__}: {error}")

        threads = [threading.Thread(target=first_dump) for _ in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert failures == []
