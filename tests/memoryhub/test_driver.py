"""What the service relies on from its PostgreSQL driver, psycopg (docs/benchmarks.md "Flood", the 500
of the first MiniLM flood)."""

from __future__ import annotations

import datetime
from functools import partial

from psycopg.adapt import AdaptersMap, PyFormat
from psycopg.types.datetime import DateDumper

from tests.threads import at_once, busy_interpreter

THREADS = 8
ROUNDS = 400


def test_threads_that_first_dump_a_type_at_once_all_find_its_dumper() -> None:
    """psycopg registers its date and time dumpers by name and puts the class in the name's place
    the first time one is asked for; before 3.3.2 another thread could look in between and find
    neither, and a push's counters (their day is a date) were answered 500 with "cannot adapt
    type 'date'". Every thread of every round must find the dumper."""
    failures: list[str] = []
    with busy_interpreter():
        for _ in range(ROUNDS):
            adapters = AdaptersMap()
            adapters.register_dumper("datetime.date", DateDumper)
            found = at_once(THREADS, partial(adapters.get_dumper, datetime.date, PyFormat.TEXT))
            failures.extend(f"{type(error).__name__}: {error}" for error in found if isinstance(error, Exception))
    assert failures == []
