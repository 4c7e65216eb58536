"""Shared fixtures: the typed cast (`school`, `other_school`), a pinned throttle clock, a real
Celery worker process against the test database."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from django.test import override_settings

from memoryhub.embedded import ManagedProcess
from memoryhub.environment import data_dir
from memoryhub.schedule import WORKER_QUEUES
from tests.factories import database_url_for_processes

if TYPE_CHECKING:
    from tests.actors import FrozenClock, School

BASE_DIR = Path(__file__).resolve().parent.parent



@pytest.fixture(scope="session")
def _celery_worker_process(
    django_db_setup: None, django_db_blocker: object, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ManagedProcess, str]]:
    """One real `celery worker` process per test process, on the test Redis broker and database,
    started idle: `celery_worker` lends it to one test at a time. Yields it and its node name."""
    from memoryhub.celery import app

    # The worker may deliver webhooks to the tests' receivers on 127.0.0.1 over plain http.
    env = dict(os.environ, DATABASE_URL=database_url_for_processes(), WEBHOOKS_ALLOW_LOOPBACK_HTTP="1")
    log_path = tmp_path_factory.mktemp("celery") / "worker.log"
    worker = ManagedProcess(
        name="worker",
        argv=[sys.executable, "-m", "celery", "-A", "memoryhub", "worker", "--pool", "solo",
              "--loglevel", "INFO", "--hostname", f"test-{os.getpid()}@%h", "--queues", WORKER_QUEUES,
              "--without-mingle", "--without-gossip"],
        env=env, cwd=BASE_DIR, log_path=log_path,
    )
    worker.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if not worker.running():
            raise RuntimeError("celery worker died:\n" + log_path.read_text())
        if replies := app.control.ping(timeout=0.5):
            break
    else:
        worker.stop()
        raise RuntimeError("celery worker did not answer in 60s:\n" + log_path.read_text())
    node = next(iter(replies[0]))
    _worker_consumes(node, consume=False)
    yield worker, node
    worker.stop()


def _worker_consumes(node: str, *, consume: bool) -> None:
    """Start or stop the worker's consumers on our queues, and wait until the worker says it does.
    A control message is a broadcast the worker can miss, so what it consumes is read back and the
    message sent again until it holds."""
    from memoryhub.celery import app

    ours = set(WORKER_QUEUES.split(","))
    wanted = ours if consume else set()
    deadline = time.monotonic() + 60
    while True:
        replies = app.control.inspect(destination=[node], timeout=5).active_queues() or {}
        consuming = {queue["name"] for queue in replies.get(node, ())} & ours
        if node in replies and consuming == wanted:
            return
        assert time.monotonic() < deadline, f"the worker still consumes {sorted(consuming)}"
        for queue in wanted - consuming:
            app.control.add_consumer(queue, destination=[node], reply=True, timeout=10)
        for queue in consuming - wanted:
            app.control.cancel_consumer(queue, destination=[node], reply=True, timeout=10)


@pytest.fixture
def celery_worker(_celery_worker_process: tuple[ManagedProcess, str]) -> Iterator[ManagedProcess]:
    """A real `celery worker` process against the test database, consuming for this test only.

    Tests that need it use `transactional_db`, so that what they write is committed and visible.
    Between such tests the worker consumes nothing: a test without it that commits rows is never
    raced by a worker acting on its after-commit tasks. Tasks queued while it was idle are
    dropped first, since they belong to tests that are over.
    """
    from memoryhub.celery import app

    worker, node = _celery_worker_process
    app.control.purge()
    _worker_consumes(node, consume=True)
    yield worker
    _worker_consumes(node, consume=False)


def run_manage(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=BASE_DIR, env=env or dict(os.environ),
                          capture_output=True, text=True, timeout=timeout)


def shared_static_root() -> str:
    """MEMORYHUB_STATIC_ROOT for the runners tests start, each with its own data dir: one directory
    for the whole session, so only the first start compresses every static file (slow) and
    the others find them compressed. Not the session's own STATIC_ROOT: this process serves static
    files from source (settings) and must not see a manifest appear."""
    return str(data_dir() / "runner-static")


@pytest.fixture(autouse=True)
def _fresh_bulk_lane(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with a new bulk lane (memoryhub.lanes): its limit adapts to the latencies
    this process saw, and a busy earlier test must not leave a later one's full pull paced."""
    from memoryhub import lanes

    monkeypatch.setattr(lanes, "_lane", None)


@pytest.fixture(scope="session", autouse=True)
def _fast_password_hashing() -> Iterator[None]:
    """Tests create many users; the production hasher is deliberately slow. Not what we test."""
    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]):
        yield


# Tables at least this large are TRUNCATEd by the flush below, the rest emptied with DELETE.
QUICK_FLUSH_TRUNCATE_BYTES = 1 << 20
# Rows post_migrate would only make again (Django's flush truncates them, then re-creates them).
QUICK_FLUSH_KEPT = frozenset({"django_content_type", "auth_permission", "django_migrations"})


def _quick_flush(database: str) -> None:
    """Empty every table, as Django's flush does, in a fraction of its time.

    Django's flush is one TRUNCATE of every table (slow whatever they hold: new files for every
    table and index) and then post_migrate re-creating content types and permissions; every
    transactional test ends with one. Here the tables an earlier test
    filled are TRUNCATEd (so no dead rows are left for later scans) and the rest, nearly always
    empty or nearly so, DELETEd in the same transaction (cheap for all of them); content types and
    permissions are kept, so nothing needs re-creating. Django's foreign keys are deferred, so the
    order does not matter."""
    from django.db import connections, transaction

    connection = connections[database]
    tables = [t for t in connection.introspection.django_table_names(only_existing=True, include_views=False)
              if t not in QUICK_FLUSH_KEPT]
    with transaction.atomic(using=database), connection.cursor() as cursor:
        cursor.execute("SELECT relname FROM pg_class WHERE relname = ANY(%s) AND relkind = 'r' "
                       "AND pg_relation_size(oid) >= %s", [tables, QUICK_FLUSH_TRUNCATE_BYTES])
        large = {name for (name,) in cursor.fetchall()}
        cursor.execute("SET CONSTRAINTS ALL DEFERRED")
        if large:
            cursor.execute("TRUNCATE " + ", ".join(connection.ops.quote_name(t) for t in sorted(large)) + " CASCADE")
        for table in tables:
            if table not in large:
                cursor.execute(f"DELETE FROM {connection.ops.quote_name(table)}")  # noqa: S608 - our table names


def _flush_retrying_deadlocks() -> None:
    """A transactional test ends with Django's `flush`, here `_quick_flush` (unless it asks for its
    sequences reset: Django's own). A process the suite runs beside it — the Celery worker finishing
    an embedding task an earlier test queued, which now also records its change event — can hold a
    lock on one table while waiting for another that the flush already took; PostgreSQL then aborts
    one of the two, sometimes the flush. The worker's transaction is short: the flush is tried
    again, at most three times."""
    from django.core.management.base import CommandError
    from django.core.management.commands import flush
    from django.db import OperationalError

    handle = flush.Command.handle

    def handle_retrying(self: Any, **options: Any) -> None:
        quick = not options.get("reset_sequences", True) and not options.get("interactive", True)
        for attempt in range(3):
            try:
                if quick:
                    return _quick_flush(options["database"])
                return handle(self, **options)
            except (CommandError, OperationalError) as error:
                cause = error.__cause__ if isinstance(error, CommandError) else error
                deadlock = isinstance(cause, OperationalError) and "deadlock" in str(cause)
                if not deadlock or attempt == 2:
                    raise
                time.sleep(0.2)

    flush.Command.handle = handle_retrying  # type: ignore[method-assign]


_flush_retrying_deadlocks()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_teardown() -> Iterator[None]:
    """Before a test's fixtures are torn down (a transactional test's flush TRUNCATEs every table),
    this process's change-event publisher thread finishes what the test's writes handed it
    (memories.changes.publish): its claim must not race the flush."""
    from memories.changes.publish import wait_published

    wait_published()
    yield


@pytest.fixture(autouse=True)
def _fresh_throttle_counters() -> None:
    """Each test starts with empty rate-limit windows; the throttle tests exercise the limits."""
    from accounts.throttles import throttle_state_clear

    throttle_state_clear()


@pytest.fixture
def school(db: None) -> School:
    """A school with an admin, a teacher of `stack`, stacks "alice" and "bob", a school key and an
    agent key bound to "alice" (tests/actors.py)."""
    from tests.actors import school_cast

    return school_cast()


@pytest.fixture
def other_school(db: None) -> School:
    """A second school, for isolation tests. Its stacks are "carol" and "dave", so its keys naming
    "alice" must find nothing (a same-named stack of its own would answer instead)."""
    from tests.actors import school_cast

    return school_cast("Other School", stack_slug="carol", other_stack_slug="dave")


# Half-way through a minute (and through an hour: 1_800_000_000 is a multiple of 3600), so a
# burst stays in one rate-limit window however slowly the machine runs it.
THROTTLE_CLOCK_START = 1_800_000_030.0


@pytest.fixture
def throttle_clock(monkeypatch: pytest.MonkeyPatch) -> FrozenClock:
    """Pin the rate limiter's clock (accounts.throttles.clock); the Redis counters stay real."""
    from accounts import throttles
    from tests.actors import FrozenClock

    clock = FrozenClock(THROTTLE_CLOCK_START)
    monkeypatch.setattr(throttles, "clock", clock)
    return clock


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# Marks that follow from the fixtures a test uses, so the fast tier (`make test-fast`) needs no list.
MARKS_BY_FIXTURE = {"browser": "browser", "dev_chain_node": "chain", "celery_worker": "slow"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for fixture in getattr(item, "fixturenames", ()):
            if fixture in MARKS_BY_FIXTURE:
                item.add_marker(MARKS_BY_FIXTURE[fixture])


class _LongTestsFirst:
    @pytest.hookimpl(trylast=True)  # after `-m` has deselected: the slices are of what runs
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """Start each of the longest tests (`@pytest.mark.long`) first on a worker of its own.

        pytest-xdist's work-stealing scheduler first hands each worker one contiguous slice of the
        collection, in order; a minute-long test in the middle of a slice starts when its worker gets
        there and can end the run a minute after every other test. Placing the long tests at the
        starts of the slices runs them beside the rest from the first second (docs/testing.md)."""
        workers = config.getoption("numprocesses", None)
        longest = [item for item in items if item.get_closest_marker("long")]
        if not isinstance(workers, int) or workers < 2 or not longest:
            return
        rest = [item for item in items if not item.get_closest_marker("long")]
        starts, start = [], 0
        for remaining in range(workers, 0, -1):  # the scheduler's own split: what is left / workers left
            starts.append(start)
            start += (len(items) - start) // remaining
        placed: dict[int, pytest.Item] = {}
        for n, item in enumerate(longest):
            slot = starts[n % workers] + n // workers
            placed[slot] = item
        others = iter(rest)
        items[:] = [placed[i] if i in placed else next(others) for i in range(len(items))]


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_LongTestsFirst(), "long-tests-first")
