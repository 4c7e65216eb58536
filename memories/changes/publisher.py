"""This process's publisher thread (docs/architecture.md §11): writers hand it the ids of their
committed events and return at once, so a write's response never waits for the claim, Redis or the
event consumers. It publishes them in commit order, several writes' at once when they queue up. A
process that exits with ids still queued loses nothing: the events are in the table, and the relay
publishes them (memories.changes.publish).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable

from django.db import DEFAULT_DB_ALIAS, connections


class Publisher:
    """One daemon thread per process (started on first use, again in a forked child) that calls
    `publish(ids)` with what writers `submit`."""

    MAX_QUEUED = 10_000  # beyond this (the database or Redis is stuck) writers leave it to the relay

    def __init__(self, publish: Callable[[list[int]], None]) -> None:
        self._publish = publish
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[list[int]] = queue.SimpleQueue()
        self._pid = 0
        self._queued = 0
        self._idle = threading.Event()
        self._idle.set()

    def submit(self, event_ids: list[int]) -> None:
        with self._lock:
            if self._pid != os.getpid():  # first use, or a forked child (a Celery worker)
                self._queue, self._queued, self._pid = queue.SimpleQueue(), 0, os.getpid()
                threading.Thread(target=self._work, args=(self._queue,), name="change-events-publisher",
                                 daemon=True).start()
            if self._queued >= self.MAX_QUEUED:
                return
            self._queued += 1
            self._idle.clear()
        self._queue.put(event_ids)

    def _work(self, work: queue.SimpleQueue[list[int]]) -> None:
        while True:
            batches = [work.get()]
            with contextlib.suppress(queue.Empty):
                while len(batches) < 100:
                    batches.append(work.get_nowait())
            try:
                self._publish([event_id for batch in batches for event_id in batch])
            finally:
                if work.empty():  # idle: give the connection back to the pool (or keep it, CONN_MAX_AGE)
                    with contextlib.suppress(Exception):
                        connections[DEFAULT_DB_ALIAS].close_if_unusable_or_obsolete()
                with self._lock:
                    self._queued -= len(batches)
                    if self._queued <= 0:
                        self._idle.set()

    def wait_idle(self, timeout: float) -> bool:
        return self._idle.wait(timeout)
