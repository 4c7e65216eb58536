"""The read replica (docs/production.md §4): which reads go to it, and which never do.

A real streaming standby of the session's embedded PostgreSQL (`pg_basebackup -R` from the
pgserver binaries, started as a hot standby) is the `replica` alias for these tests. With its WAL
replay paused, a write committed on the primary is missing on the standby, so every figure shows
where it was read from: the dashboard's charts, backlog counts and a stack's usage series come from
the replica (stale), while the access decision (stacks/selectors.py), sync pull, the student page's
list and any read inside a transaction see the write (primary). The captured queries of each
connection say the same. When replay resumes the replica catches up.

In the suite's normal settings the alias is a test mirror of the primary and no read uses it
(DATABASE_READ_ALIAS = "default"), so other tests are unaffected.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connections, transaction
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.principal import Principal
from accounts.selectors import audit_events_visible_to, principal_for_session
from accounts.services import audit_record
from billing.models import Payment
from billing.selectors import overflow_charge, payments_of, usage_of
from dashboard.overview import embedding_backlog_total, summary, written_per_day
from memories.lifecycle.jobs import JOB_DECAY, job_runs_recent
from memories.models import JobRun
from memories.reads.usage import stack_usage
from memories.services import memory_create
from memoryhub.embedded import EmbeddedPostgres, free_port, pgserver_bin
from memoryhub.replica import read_alias
from stacks.selectors import stacks_visible_to
from tests.actors import School
from tests.connections import connection_settings

pytestmark = pytest.mark.slow  # a second PostgreSQL and settings processes

BASE_DIR = Path(__file__).resolve().parents[2]
CATCH_UP_TIMEOUT = 30.0


def _primary() -> EmbeddedPostgres | None:
    from tests import plugin_embedded

    return next((s for s in plugin_embedded._started if isinstance(s, EmbeddedPostgres)), None)


@pytest.fixture(scope="module")
def standby(django_db_setup: None) -> Iterator[EmbeddedPostgres]:
    """A hot standby streaming from the session's embedded PostgreSQL, for this module only."""
    primary = _primary()
    if primary is None:
        pytest.skip("needs the session's own embedded PostgreSQL (DATABASE_URL points elsewhere)")
    root = Path(tempfile.mkdtemp(prefix="memoryhub-standby-"))
    server = EmbeddedPostgres(root / "pgdata", free_port(), log_path=root / "standby.log")
    # Thrown away after the module: no fsync of the copy or of the standby, an immediate shutdown.
    server.process.argv += ["-c", "fsync=off"]
    server.process.stop_signal = signal.SIGQUIT
    try:
        server.pgdata.mkdir(parents=True)
        if server.user is not None:
            server._prepare_for_root()  # the data dir belongs to the account PostgreSQL runs as
        # -c fast: an immediate checkpoint (a spread one takes minutes); -R: standby.signal and
        # primary_conninfo, so the copy starts as a streaming standby.
        subprocess.run([str(pgserver_bin() / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port),
                        "-U", "postgres", "-D", str(server.pgdata), "-R", "-X", "stream", "-c", "fast",
                        "--no-sync"], check=True, user=server.user, capture_output=True, timeout=120)
        server.prepare()  # a cluster is there: no initdb
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def replica(standby: EmbeddedPostgres) -> Iterator[EmbeddedPostgres]:
    """The `replica` alias pointed at the standby, and the read-only paths told to use it."""
    with connection_settings("replica", HOST="127.0.0.1", PORT=str(standby.port)):
        try:
            with override_settings(DATABASE_READ_ALIAS="replica"):
                yield standby
        finally:
            _replay(resume=True)


def _sql(alias: str, statement: str) -> object:
    with connections[alias].cursor() as cursor:
        cursor.execute(statement)
        row = cursor.fetchone()
    return row[0] if row else None


def _replay(*, resume: bool) -> None:
    _sql("replica", "SELECT pg_wal_replay_resume()" if resume else "SELECT pg_wal_replay_pause()")


def _caught_up() -> None:
    """Wait (bounded) until the standby has replayed everything the primary has committed."""
    # The insert position, not the write position: the test cluster commits asynchronously
    # (EmbeddedPostgres(durable=False)), so a commit's record may be in the WAL buffers, not yet
    # written, and a standby caught up to the write position may still lack it.
    target = str(_sql("default", "SELECT pg_current_wal_insert_lsn()"))
    deadline = time.monotonic() + CATCH_UP_TIMEOUT
    while time.monotonic() < deadline:
        if _sql("replica", f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn"):
            return
        time.sleep(0.05)
    raise AssertionError(f"the standby did not replay up to {target} in {CATCH_UP_TIMEOUT:.0f}s")


def _today(principal: Principal) -> int:
    return written_per_day(principal)[-1][1]


@pytest.mark.django_db(transaction=True, databases={"default", "replica"})
def test_stale_tolerant_reads_use_the_replica_and_the_rest_the_primary(replica: EmbeddedPostgres,
                                                                        school: School) -> None:
    assert _sql("replica", "SELECT pg_is_in_recovery()") is True  # a real standby, not a copy
    assert _sql("default", "SELECT pg_is_in_recovery()") is False
    principal = principal_for_session(school.admin)
    assert principal is not None
    _caught_up()
    assert _today(principal) == 0

    _replay(resume=False)  # from here the standby lags: the next write is on the primary only
    memory = memory_create(stack=school.stack, kind="note", payload={"content": "written after the pause"},
                           source="api")

    # Reads that tolerate staleness: from the replica, which has not seen the write.
    with CaptureQueriesContext(connections["replica"]) as on_replica, \
            CaptureQueriesContext(connections["default"]) as on_primary:
        assert _today(principal) == 0
        assert embedding_backlog_total(principal) == 0
        usage = stack_usage(stack=school.stack, principal=principal)
    assert "note" not in usage["bytes_by_kind"]
    assert len(on_replica.captured_queries) >= 4
    # What stayed on the primary: the access decisions (which stacks the caller sees) only.
    assert all("memories_memory" not in q["sql"] and "stackdailyactivity" not in q["sql"]
               for q in on_primary.captured_queries), on_primary.captured_queries

    # The access decision, the overview's counters and anything in a transaction: the primary.
    assert [s.memory_count for s in stacks_visible_to(principal).filter(pk=school.stack.pk)] == [1]
    assert summary(principal).memories == 1
    with transaction.atomic(), CaptureQueriesContext(connections["replica"]) as on_replica:
        assert read_alias() == "default"
        assert _today(principal) == 1
        # (Its value depends on whether a worker of the suite has embedded the note already.)
        embedding_backlog_total(principal)
    assert on_replica.captured_queries == []

    # Pages: the overview's chart comes from the replica; a student's list and sync pull do not.
    browser = Client()
    browser.force_login(school.admin)
    with CaptureQueriesContext(connections["replica"]) as on_replica:
        assert browser.get("/dashboard/").status_code == 200
    assert any("stackdailyactivity" in q["sql"] for q in on_replica.captured_queries)
    with CaptureQueriesContext(connections["replica"]) as on_replica:
        page = browser.get(f"/dashboard/students/{school.stack.slug}/")
    assert page.status_code == 200 and str(memory.pk) in page.content.decode()
    # The student page's usage chart is its only replica read (memories/reads/usage.py, with its cost
    # estimate's usage figures from billing.selectors.usage_of: the stacks' counters).
    assert on_replica.captured_queries
    assert all(("memories_memory" in q["sql"] or "teleport_snapshot" in q["sql"]
                or ("stacks_stack" in q["sql"] and "bytes_used" in q["sql"])) and "changeevent" not in q["sql"]
               for q in on_replica.captured_queries), on_replica.captured_queries
    agent = APIClient()
    agent.credentials(HTTP_AUTHORIZATION=f"Bearer {school.agent_secret}")
    with CaptureQueriesContext(connections["replica"]) as on_replica:
        pulled = agent.post("/sync/pull", {"stack_id": school.stack.slug, "since": None}, format="json")
    assert pulled.status_code == 200
    assert memory.record_id in {op["record_id"] for op in pulled.json()["operations"]}
    assert on_replica.captured_queries == []  # an agent reads what it just pushed

    _replay(resume=True)
    _caught_up()
    assert _today(principal) == 1
    assert "note" in stack_usage(stack=school.stack, principal=principal)["bytes_by_kind"]


def _listings(principal: Principal) -> tuple[set[str], set[str], set[int], int]:
    """What the audit log, the payment history, the latest job runs and the usage figure show."""
    return ({event.action for event in audit_events_visible_to(principal)},
            {payment.public_id for payment in payments_of(principal)},
            {run.pk for run in job_runs_recent()},
            usage_of(principal.organization).storage_used)


@pytest.mark.django_db(transaction=True, databases={"default", "replica"})
def test_audit_log_payments_usage_and_job_runs_are_listed_from_the_replica(replica: EmbeddedPostgres,
                                                                           school: School) -> None:
    principal = principal_for_session(school.admin)
    assert principal is not None
    _caught_up()
    before = _listings(principal)

    _replay(resume=False)  # the standby lags from here
    audit_record(organization=school.org, action="replica.check", target_type="test", target_id="1")
    now = timezone.now()
    payment = Payment.objects.create(organization=school.org, tier="core", amount=5_000_000, created_at=now,
                                     expires_at=now + timedelta(hours=1))
    run = JobRun.objects.create(name=JOB_DECAY, status=JobRun.Status.SUCCEEDED)
    memory_create(stack=school.stack, kind="note", payload={"content": "stored after the pause"}, source="api")

    # The listings: from the replica, which has seen none of it, and not a query on the primary.
    with CaptureQueriesContext(connections["replica"]) as on_replica, \
            CaptureQueriesContext(connections["default"]) as on_primary:
        assert _listings(principal) == before
    tables = ("accounts_auditevent", "billing_payment", "memories_jobrun", "stacks_stack")
    assert all(any(table in q["sql"] for q in on_replica.captured_queries) for table in tables)
    assert not any(table in q["sql"] for q in on_primary.captured_queries for table in tables), on_primary
    # The pages and API routes that list them read the replica too.
    browser = Client()
    browser.force_login(school.admin)
    for path, table in (("/dashboard/audit/", "accounts_auditevent"), ("/dashboard/billing/", "billing_payment"),
                        ("/dashboard/", "memories_jobrun")):
        with CaptureQueriesContext(connections["replica"]) as on_replica:
            assert browser.get(path).status_code == 200, path
        assert any(table in q["sql"] for q in on_replica.captured_queries), path

    # What bills (the renewal's overflow) and anything in a transaction: the primary.
    with CaptureQueriesContext(connections["replica"]) as on_replica:
        overflow_charge(school.org, tier="core")
    assert on_replica.captured_queries == []
    with transaction.atomic():
        audit, payments, runs, stored = _listings(principal)
        assert "replica.check" in audit and payment.public_id in payments and run.pk in runs
        assert stored > before[3]

    _replay(resume=True)
    _caught_up()
    audit, payments, runs, stored = _listings(principal)
    assert "replica.check" in audit and payment.public_id in payments and run.pk in runs and stored > before[3]


def test_without_a_replica_url_every_read_is_on_the_primary() -> None:
    from django.conf import settings

    assert settings.DATABASE_READ_ALIAS == "default" and read_alias() == "default"
    assert settings.DATABASES["replica"]["TEST"]["MIRROR"] == "default"  # the suite's mirror only


def _settings_in_subprocess(**env: str) -> subprocess.CompletedProcess[str]:
    script = ("import json, memoryhub.settings as s; "
              "print(json.dumps({'alias': s.DATABASE_READ_ALIAS, 'databases': s.DATABASES}, default=str))")
    return subprocess.run([sys.executable, "-c", script], cwd=BASE_DIR, env=dict(os.environ, **env),
                          capture_output=True, text=True, timeout=60)


def test_replica_url_gets_the_primarys_pool_and_timeouts() -> None:
    result = _settings_in_subprocess(DATABASE_REPLICA_URL="postgresql://reader@replica.internal:5433/memoryhub")
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    default, replica = loaded["databases"]["default"], loaded["databases"]["replica"]
    assert loaded["alias"] == "replica"
    assert (replica["HOST"], replica["PORT"], replica["USER"]) == ("replica.internal", 5433, "reader")
    assert replica["OPTIONS"] == default["OPTIONS"] and replica["OPTIONS"]["connect_timeout"] == 5
    assert "MIRROR" not in (replica.get("TEST") or {})

    refused = _settings_in_subprocess(DATABASE_REPLICA_URL="mysql://x@y/z")
    assert refused.returncode != 0 and "DATABASE_REPLICA_URL" in refused.stderr
