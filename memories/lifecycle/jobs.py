"""Job-run bookkeeping every lifecycle job shares: one run at a time, each run recorded.

* **One run at a time.** Every job takes a session-level Postgres advisory lock named after it.
  A run that finds the lock taken records a `skipped` JobRun and touches nothing. The lock dies
  with its connection, so a killed worker never leaves a job stuck.
* **Recorded.** `run_job` writes a JobRun with the counts the work filled in, also when it fails
  or hits its time limit, so `/api/v1/jobs/` shows what each run did.
* **Per school.** A job is service-wide (one decay pass over every stack), but a school admin may
  see only their school's numbers. What a job changed is announced after each commit by the write
  kernel (a `MemoryChange` naming the stack, the source and the action; memories/writes/hooks.py),
  so `run_job` listens while the job runs and counts each change of the job's own source under the
  stack's organization (`JobRun.organization_counts`): tombstones of the decay pass, purges of the
  TTL job, beliefs of the promotion job. Jobs that change no memory (the embedding sweep, per-stack
  indexes) have no per-school counts: a school sees when they ran and whether they succeeded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, OperationalError, connection
from django.db.models import QuerySet
from django.utils import timezone

from memories.models import JobRun
from memories.writes.hooks import MemoryChange, register_listener, unregister_listener
from memoryhub.errors import InvalidInput
from memoryhub.metrics import JOB_DURATION, JOB_RUNS
from memoryhub.replica import read_alias
from stacks.models import Stack

logger = logging.getLogger(__name__)

JOB_DECAY = "decay"
JOB_TTL_PURGE = "ttl_purge"
JOB_PROMOTION = "promotion"
JOB_EMBEDDING_SWEEP = "embedding_sweep"
JOB_STACK_VECTOR_INDEXES = "stack_vector_indexes"
JOB_NAMES = (JOB_DECAY, JOB_TTL_PURGE, JOB_PROMOTION, JOB_EMBEDDING_SWEEP, JOB_STACK_VECTOR_INDEXES)

# Advisory-lock namespace (first key of the two-int form); the second key is hashtext(job name).
JOB_LOCK_NAMESPACE = 730_117

JOB_RUN_RETENTION = timedelta(days=30)
DEADLOCK_RETRIES = 3

Progress = Callable[[int], None]

# The changes each job makes that count towards a school's share: (change source, action) → the
# name of the count. The sources are the jobs' own (decay_pass.DECAY_SOURCE, ttl.TTL_SOURCE, the
# promotion job's default source); tests/memories/test_job_runs_per_school.py keeps them in step.
PER_ORGANIZATION = {
    JOB_DECAY: {("decay", "forget"): "forgotten"},
    JOB_TTL_PURGE: {("ttl", "expire"): "purged"},
    JOB_PROMOTION: {("promotion", "create"): "beliefs_created"},
}


class _ChangeTally:
    """A change listener counting one job's changes per stack. The decay pass commits from several
    threads, so counting takes a lock."""

    def __init__(self, wanted: dict[tuple[str, str], str]) -> None:
        self.wanted = wanted
        self.by_stack: defaultdict[int, Counter[str]] = defaultdict(Counter)
        self.lock = threading.Lock()

    def __call__(self, change: MemoryChange) -> None:
        name = self.wanted.get((change.source, change.action))
        if name is not None:
            with self.lock:
                self.by_stack[change.stack_id][name] += len(change.memory_ids)

    def by_organization(self) -> dict[str, dict[str, int]]:
        with self.lock:
            by_stack = {stack_id: dict(counts) for stack_id, counts in self.by_stack.items()}
        totals: defaultdict[str, Counter[str]] = defaultdict(Counter)
        owners = Stack.objects.filter(pk__in=list(by_stack)).values_list("pk", "organization_id")
        for stack_id, organization_id in owners:  # a stack deleted meanwhile is nobody's share any more
            totals[str(organization_id)].update(by_stack[stack_id])
        return {organization: dict(counts) for organization, counts in totals.items()}


def job_run_share(run: JobRun, organization_id: int) -> dict[str, int]:
    """What `run` did to one organization's stacks: the job's per-organization counts, zero when it
    touched none of them (empty for jobs that have none, and for skipped runs)."""
    if run.status == JobRun.Status.SKIPPED:
        return {}
    names = dict.fromkeys(PER_ORGANIZATION.get(run.name, {}).values(), 0)
    return {**names, **(run.organization_counts or {}).get(str(organization_id), {})}


def _try_job_lock(name: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))", [JOB_LOCK_NAMESPACE, name])
        row = cursor.fetchone()
    return bool(row and row[0])


def _release_job_lock(name: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", [JOB_LOCK_NAMESPACE, name])


@contextmanager
def job_lock(name: str) -> Iterator[bool]:
    """Hold the job's advisory lock for the block; yields False (and holds nothing) if taken."""
    acquired = _try_job_lock(name)
    try:
        yield acquired
    finally:
        if acquired:
            _release_job_lock(name)


def run_job(name: str, work: Callable[[dict[str, Any]], None]) -> JobRun:
    """Run `work(counts)` as job `name`: one at a time, recorded in a JobRun.

    `work` fills `counts` as it goes, so a run that fails (or hits its time limit) still records
    what it did before. Exceptions are recorded and re-raised. Must not be called inside a
    transaction that the work's batches would otherwise join (the tasks and the command call it
    in autocommit mode).
    """
    with job_lock(name) as acquired:
        if not acquired:
            logger.info("job %s skipped: a previous run still holds the lock", name)
            JOB_RUNS.labels(name, JobRun.Status.SKIPPED).inc()
            return JobRun.objects.create(
                name=name, status=JobRun.Status.SKIPPED, finished_at=timezone.now(), duration_ms=0,
                counts={"reason": "previous run still in progress"},
            )
        run = JobRun.objects.create(name=name, status=JobRun.Status.RUNNING)
        counts: dict[str, Any] = {}
        tally = _ChangeTally(PER_ORGANIZATION[name]) if name in PER_ORGANIZATION else None
        if tally is not None:
            register_listener(tally)
        started = time.monotonic()
        try:
            work(counts)
        except BaseException as exc:  # incl. Celery's SoftTimeLimitExceeded: record, then re-raise
            run.status = JobRun.Status.FAILED
            run.error = f"{type(exc).__name__}: {str(exc)[:500]}"
            raise
        else:
            run.status = JobRun.Status.SUCCEEDED
        finally:
            if tally is not None:
                unregister_listener(tally)
                try:
                    run.organization_counts = tally.by_organization()
                except DatabaseError:  # the run's own record matters more than its per-school split
                    logger.warning("job %s: could not split its counts by organization", name)
            run.counts = counts
            run.finished_at = timezone.now()
            run.duration_ms = int((time.monotonic() - started) * 1000)
            JOB_RUNS.labels(name, run.status).inc()
            JOB_DURATION.labels(name).observe(run.duration_ms / 1000)
            run.save(update_fields=["status", "error", "counts", "organization_counts", "finished_at",
                                    "duration_ms"])
        return run


def job_runs_recent(*, name: str | None = None) -> QuerySet[JobRun]:
    """Job runs, newest first (the caller decides who may see them: operators and school admins).
    For listing (the overview's latest runs, the jobs API): from the replica when there is one, as a
    list a moment old is fine (docs/production.md §4)."""
    runs = JobRun.objects.using(read_alias()).order_by("-started_at", "-pk")
    if name:
        if name not in JOB_NAMES:
            raise InvalidInput("Unknown job.", fields={"name": [f"One of: {', '.join(JOB_NAMES)}."]})
        runs = runs.filter(name=name)
    return runs


def is_retryable_conflict(exc: OperationalError) -> bool:
    # 40P01 deadlock_detected, 40001 serialization_failure: a concurrent push touched the batch.
    return getattr(exc.__cause__, "sqlstate", None) in {"40P01", "40001"}

