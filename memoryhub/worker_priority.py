"""The worker yields the cores to requests while embedding keeps up, and takes its equal share once
it falls behind (docs/operations.md §8).

Requests and embedding share the machine's cores. While the worker keeps up, every millisecond it
takes from a request is latency an agent waits for and a memory gains nothing from: the worker's
session runs at `WORKER_CPU_NICE` (the runner's default 10) and, unless `WORKER_CPU_IDLE` is off, its
threads at the scheduling policy SCHED_IDLE, so a waking request takes a core from it at once. When
the oldest change still awaiting a vector is older than `EMBEDDING_CATCH_UP_SECONDS` (default 60),
time to searchable is what a school waits on: the worker's session goes back to niceness 0 and the
normal policy, an equal of the web server's and PostgreSQL's, until that age is under half the
threshold (the gap keeps it from flapping). Where the kernel weighs each process by its niceness
(no autogroup, or the runner in a CPU cgroup of its own: memoryhub.cpu_cgroup), "equal" is the
niceness `equal_share_nice` at which the worker's busy pool processes together weigh what one
process at niceness 0 does, as its one session group did under autogroup.

`WorkerPriority` runs in the runner (`make run`), on a thread of its own so a slow or absent database
never holds up the supervision of the children. It reads one EXISTS per `CHECK_SECONDS` from the
backlog's partial index: each stack's oldest awaiting change, one index probe per stack with a
backlog, however many rows await. While the web processes see requests slowed (memoryhub.lanes marks
it in Redis), the worker yields even when behind; while bulk requests also queue for the lanes (a
flood), embedding waits altogether (memoryhub.embedding_hold) until requests are no longer slowed,
for up to `EMBEDDING_HOLD_SECONDS` behind, and catches up as an equal past it.
A deployment whose worker runs under systemd or Kubernetes sets its CPU weight there instead.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from memoryhub.embedded import set_session_idle, set_session_nice

if TYPE_CHECKING:
    import psycopg

# The memories awaiting a current vector: the predicate of the partial index
# `memories_embedding_backlog` (memories.models), so counting them reads that small index, not the
# table; keep the two in step. memoryhub is the layer every app stands on and imports none of them
# ([tool.importlinter] in pyproject.toml), so it is plain SQL here (memoryhub.health and
# memories.search.embedding_backlog read it too). The table is `m`.
AWAITING_VECTORS = "FROM memories_memory m WHERE m.embedded_version IS NULL AND m.deleted_at IS NULL"

# The stacks with a backlog, as the recursive CTE `waiting(stack_id)` (its last row is NULL): a loose
# index scan of the partial index on (stack, server_updated_at), one probe a stack however many rows
# await. And the oldest awaiting change of the stack `w.stack_id`, one more probe.
BACKLOG_STACKS_CTE = f"""waiting(stack_id) AS (
    (SELECT m.stack_id {AWAITING_VECTORS} ORDER BY m.stack_id LIMIT 1)
  UNION ALL
    SELECT (SELECT m.stack_id {AWAITING_VECTORS} AND m.stack_id > w.stack_id ORDER BY m.stack_id LIMIT 1)
      FROM waiting w WHERE w.stack_id IS NOT NULL
)"""  # noqa: S608 - only fixed text is interpolated
OLDEST_AWAITING_IN_W = (f"(SELECT m.server_updated_at {AWAITING_VECTORS} AND m.stack_id = w.stack_id "
                        "ORDER BY m.server_updated_at LIMIT 1)")

# Whether some memory has awaited its vector for longer than %(seconds)s since it last changed: each
# backlog stack's oldest awaiting change. A plain EXISTS over the awaiting rows with the age as a
# filter walks the whole backlog whenever none is that old: every row of a bulk import's young
# backlog, at every look (docs/operations.md §8).
BEHIND_SQL = f"""
WITH RECURSIVE {BACKLOG_STACKS_CTE}
SELECT EXISTS (SELECT 1 FROM waiting w WHERE w.stack_id IS NOT NULL
                  AND {OLDEST_AWAITING_IN_W} < statement_timestamp() - make_interval(secs => %(seconds)s))
"""  # noqa: S608 - only fixed text is interpolated; the age is a parameter

# How often the runner looks. A flood that begins while the worker catches up as an equal meets it
# at that share until the next look; a look costs a few milliseconds of the runner's CPU
# (docs/operations.md §8).
CHECK_SECONDS = 1.0
# Embedding goes on waiting this long after a flood, or requests slowed in its wake, were last seen,
# so that it does not start and stop with every lull (each start slows the requests again at once).
HOLD_LINGER_SECONDS = 30.0
# Each step of niceness weighs ~1.25x less in the kernel's CFS weight table (sched_prio_to_weight).
NICE_STEP_WEIGHT = 1.25
# Set (with an expiry) by the web processes while they hold bulk work back (memoryhub.lanes).
PRESSURE_KEY = "mh:lanes:pressure"
# Set (with an expiry) by a web process while bulk requests queue for its lane: a flood of bulk work.
BULK_QUEUED_KEY = "mh:lanes:bulk-queued"
# How long one look may take: a database that hangs must not hang the thread forever either.
CONNECT_TIMEOUT_SECONDS = 3
STATEMENT_TIMEOUT_MS = 3000


class WorkerPriority:
    """Sets the worker's session niceness (and, with `idle`, its threads' scheduling policy) from the
    embedding lag; `check()` is one look."""

    def __init__(self, database_url: str, worker_pid: Callable[[], int | None], *, nice: int,
                 catch_up_seconds: float, log: Callable[[str], None],
                 requests_pressed: Callable[[], bool] = lambda: False, idle: bool = True,
                 equal_nice: int = 0, hold_seconds: float = 0,
                 bulk_queued: Callable[[], bool] = lambda: False,
                 set_held: Callable[[bool], None] = lambda held: None) -> None:
        self.database_url = database_url
        self.requests_pressed = requests_pressed
        self.bulk_queued = bulk_queued
        self.hold_seconds = hold_seconds
        self.set_held = set_held
        self.held = False
        self._flooded_at = -math.inf  # monotonic: when a flood of bulk work was last seen
        self.worker_pid = worker_pid
        self.nice = nice
        self.equal_nice = equal_nice
        self.idle = idle
        self.catch_up_seconds = catch_up_seconds
        self.log = log
        self.catching_up = False
        self._connection: psycopg.Connection | None = None

    def check(self) -> None:
        pid = self.worker_pid()
        if pid is None:
            return
        # Behind past the threshold: catch up; caught up again once under half of it. A database
        # that cannot answer (its outage is reported elsewhere) leaves things as they are.
        behind = self._behind(self.catch_up_seconds / 2 if self.catching_up else self.catch_up_seconds)
        if behind is not None and behind != self.catching_up:
            self.catching_up = behind
            if behind:
                self.log(f"embedding is over {self.catch_up_seconds:g}s behind: the worker takes an equal "
                         "share of the cores until it catches up")
            else:
                self.log(f"embedding caught up: the worker yields the cores to requests again (nice {self.nice})")
        # A flood - requests slowed while bulk requests queue for the lanes (memoryhub.lanes marks
        # both) - makes embedding wait (memoryhub.embedding_hold), and requests still slowed keep it
        # waiting, for up to `hold_seconds` behind: the flood's backlog waits until its tail has
        # passed, requests do not. Requests slowed by a load the worker keeps up with queue no bulk
        # work, and are no reason to let vectors go stale. Past the bound embedding catches up as an
        # equal, flood or not.
        pressed = self.requests_pressed()
        now = time.monotonic()
        if self.hold_seconds > 0 and pressed and (self.held or self.bulk_queued()):
            self._flooded_at = now
        flooded = now - self._flooded_at <= HOLD_LINGER_SECONDS
        past_bound = flooded and self._behind(self.hold_seconds) is True
        held = flooded and not past_bound
        if held != self.held:
            self.held = held
            self.log("a flood of bulk work slows requests: embedding waits until it ends (for up to "
                     f"{self.hold_seconds:g}s behind)" if held else "embedding resumes")
        self.set_held(held)  # every look: the hold lapses by itself unless renewed
        # Set at every look, not only on a change: a restarted worker starts at `nice` again, and the
        # kernel refuses an unprivileged change of a group's niceness within 100 ms of another.
        # Without a hold (`hold_seconds` 0) the worker yields while requests are slowed, even when behind.
        equal = self.catching_up and (past_bound or not (pressed or held))
        set_session_nice(pid, self.equal_nice if equal else self.nice)
        if self.idle:  # every look too: a thread or pool process started since took its creator's policy
            set_session_idle(pid, not equal)

    def _behind(self, seconds: float) -> bool | None:
        import psycopg

        try:
            if self._connection is None or self._connection.closed:
                self._connection = psycopg.connect(
                    self.database_url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS,
                    options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS}", application_name="memoryhub-runner")
            row = self._connection.execute(BEHIND_SQL, {"seconds": seconds}).fetchone()
            return row is not None and bool(row[0])  # (EXISTS always answers one row)
        except psycopg.Error:
            self.close()
            return None

    def close(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(Exception):
                self._connection.close()
            self._connection = None

    def run_in_background(self) -> None:
        """Look every CHECK_SECONDS on a daemon thread, for as long as this process lives."""
        def loop() -> None:
            while True:
                time.sleep(CHECK_SECONDS)
                self.check()

        threading.Thread(target=loop, name="worker-priority", daemon=True).start()


def equal_share_nice(processes: int) -> int:
    """The niceness at which `processes` busy processes together weigh what one at niceness 0 does."""
    return min(19, round(math.log(max(1, processes)) / math.log(NICE_STEP_WEIGHT)))
