"""Job-run bookkeeping every lifecycle job shares: one run at a time, each run recorded.

* **One run at a time.** Every job takes a session-level Postgres advisory lock named after it.
  A run that finds the lock taken records a `skipped` JobRun and touches nothing. The lock dies
  with its connection, so a killed worker never leaves a job stuck.
* **Recorded.** `run_job` writes a JobRun with the counts the work filled in, also when it fails
  or hits its time limit, so `/api/v1/jobs/` shows what each run did.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from django.db import OperationalError, connection
from django.db.models import QuerySet
from django.utils import timezone

from memories.models import JobRun
from memoryhub.errors import InvalidInput

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
            return JobRun.objects.create(
                name=name, status=JobRun.Status.SKIPPED, finished_at=timezone.now(), duration_ms=0,
                counts={"reason": "previous run still in progress"},
            )
        run = JobRun.objects.create(name=name, status=JobRun.Status.RUNNING)
        counts: dict[str, Any] = {}
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
            run.counts = counts
            run.finished_at = timezone.now()
            run.duration_ms = int((time.monotonic() - started) * 1000)
            run.save(update_fields=["status", "error", "counts", "finished_at", "duration_ms"])
        return run


def job_runs_recent(*, name: str | None = None) -> QuerySet[JobRun]:
    """Job runs, newest first (the caller decides who may see them: operators and school admins)."""
    runs = JobRun.objects.order_by("-started_at", "-pk")
    if name:
        if name not in JOB_NAMES:
            raise InvalidInput("Unknown job.", fields={"name": [f"One of: {', '.join(JOB_NAMES)}."]})
        runs = runs.filter(name=name)
    return runs


def is_retryable_conflict(exc: OperationalError) -> bool:
    # 40P01 deadlock_detected, 40001 serialization_failure: a concurrent push touched the batch.
    return getattr(exc.__cause__, "sqlstate", None) in {"40P01", "40001"}

