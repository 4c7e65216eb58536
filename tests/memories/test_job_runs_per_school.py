"""Job runs as a school sees them: every run of the service-wide jobs, with only its own school's
numbers; staff see the totals (memories.lifecycle.jobs, memories.selectors.job_runs_scope).

Real commits (transactional tests): a job's per-school counts come from the write kernel's
after-commit announcements, as in production.
"""

from __future__ import annotations

import inspect
import itertools
import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from accounts.models import Membership, User
from memories.lifecycle.decay_pass import DECAY_SOURCE, decay_pass
from memories.lifecycle.jobs import JOB_DECAY, JOB_PROMOTION, JOB_TTL_PURGE, PER_ORGANIZATION
from memories.lifecycle.promotion import promote_lessons, promotion_run
from memories.lifecycle.ttl import TTL_SOURCE, ttl_purge
from memories.models import JobRun, Memory
from memories.search.embedding_jobs import memories_embed
from memories.services import memory_create
from stacks.models import Stack
from tests.actors import School
from tests.factories import make_user, session_client

pytestmark = pytest.mark.django_db(transaction=True)
_ids = itertools.count(1)
NOW = timezone.now().replace(microsecond=0)


def _faded(stack: Stack) -> Memory:
    """An episode nobody has touched for 400 days: the decay pass forgets it."""
    created = NOW - timedelta(days=400)
    n = next(_ids)
    return Memory.objects.create(stack=stack, kind="episode", record_id=f"faded-{n}", text=f"memory {n}",
                                 created_at=created, server_updated_at=created)


def _vectors_stored() -> None:
    """Embed the committed memories now (or wait, bounded, for the suite's worker if it holds them):
    a vector stored while the decay pass runs moves its row to another heap page, where a pass that
    reads the table by page ranges may not meet it this time (a fresh-clone run forgot 3 of 6)."""
    deadline = time.monotonic() + 10
    while pending := [str(pk) for pk in Memory.objects.filter(embedded_version__isnull=True,
                                                             deleted_at__isnull=True).values_list("pk", flat=True)]:
        memories_embed(ids=pending)
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)


def _expired(stack: Stack) -> Memory:
    n = next(_ids)
    return Memory.objects.create(stack=stack, kind="note", record_id=f"expired-{n}", text=f"note {n}",
                                 created_at=NOW, server_updated_at=NOW, expires_at=NOW - timedelta(minutes=1))


def _episode(stack: Stack, lesson: str) -> None:
    memory_create(stack=stack, kind="episode", source="test",
                  payload={"objective": f"session {next(_ids)}", "outcome": "ok", "lessons": [lesson]})


def _runs(client: Any, **query: str) -> list[dict[str, Any]]:
    response = client.get("/api/v1/jobs/", query)
    assert response.status_code == 200, response.content
    return response.json()


def test_the_per_school_counts_follow_the_jobs_own_sources() -> None:
    # The sources the jobs announce their changes under: renaming one would silently zero a school's share.
    assert (DECAY_SOURCE, "forget") in PER_ORGANIZATION[JOB_DECAY]
    assert (TTL_SOURCE, "expire") in PER_ORGANIZATION[JOB_TTL_PURGE]
    assert ("promotion", "create") in PER_ORGANIZATION[JOB_PROMOTION]
    assert inspect.signature(promote_lessons).parameters["source"].default == "promotion"


def test_a_school_sees_every_run_with_only_its_own_numbers(school: School, other_school: School) -> None:
    for _ in range(3):
        _faded(school.stack)
    for _ in range(2):
        _faded(other_school.stack)
    _faded(other_school.other_stack)
    _expired(school.other_stack)
    for lesson_owner in (school.stack, school.stack, school.stack):
        _episode(lesson_owner, "Draw the pie first")
    _vectors_stored()

    decay = decay_pass(now=NOW, workers=2)
    ttl = ttl_purge(now=NOW)
    promotion = promotion_run(now=NOW)
    assert decay.counts["forgotten"] == 6 and ttl.counts["purged"] == 1 and promotion.counts["beliefs_created"] == 1

    # School A, signed in or through its school-wide key: every run, only A's share, no error text.
    mine = _runs(session_client(school.admin))
    assert _runs(school.admin_api) == mine
    assert [(run["name"], run["scope"], run["counts"]) for run in mine] == [
        ("promotion", "organization", {"beliefs_created": 1}),
        ("ttl_purge", "organization", {"purged": 1}),
        ("decay", "organization", {"forgotten": 3}),
    ]
    # School B: the same runs, its own numbers — never A's.
    theirs = _runs(other_school.admin_api)
    assert [(run["name"], run["counts"]) for run in theirs] == [
        ("promotion", {"beliefs_created": 0}), ("ttl_purge", {"purged": 0}), ("decay", {"forgotten": 3})]
    assert {run["id"] for run in theirs} == {run["id"] for run in mine}

    # Staff: the totals of the whole service.
    staff = make_user(school.org, role=Membership.Role.TEACHER)
    User.objects.filter(pk=staff.pk).update(is_staff=True)
    staff.refresh_from_db()
    totals = {run["name"]: run for run in _runs(session_client(staff))}
    assert totals["decay"]["scope"] == "service"
    assert totals["decay"]["counts"]["forgotten"] == 6 and "scanned" in totals["decay"]["counts"]
    assert totals["ttl_purge"]["counts"]["purged"] == 1

    # What is stored: one share per school that was touched.
    stored = JobRun.objects.get(pk=decay.pk).organization_counts
    assert stored == {str(school.org.pk): {"forgotten": 3}, str(other_school.org.pk): {"forgotten": 3}}


def test_jobs_without_a_school_share_show_when_they_ran_and_how(school: School) -> None:
    JobRun.objects.create(name="embedding_sweep", status=JobRun.Status.FAILED, finished_at=NOW,
                          duration_ms=12, counts={"embedded": 40}, error="OperationalError: in stack 7 of school 9")
    JobRun.objects.create(name="decay", status=JobRun.Status.SKIPPED, finished_at=NOW, duration_ms=0,
                          counts={"reason": "previous run still in progress"})
    sweep, skipped = sorted(_runs(school.admin_api), key=lambda run: run["name"], reverse=True)
    assert (sweep["name"], sweep["status"], sweep["counts"], sweep["error"]) == ("embedding_sweep", "failed", {}, "")
    assert sweep["duration_ms"] == 12 and sweep["finished_at"]
    assert (skipped["status"], skipped["counts"]) == ("skipped", {})


def test_teachers_and_agent_keys_see_no_job_runs(school: School) -> None:
    for client in (school.agent, session_client(school.teacher)):
        response = client.get("/api/v1/jobs/")
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "admin_only"
