"""TTL purge: memories whose `expires_at` has passed are deleted in bounded batches, and old
job runs are pruned."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import Count, Sum
from django.utils import timezone

from memories.lifecycle.jobs import JOB_RUN_RETENTION, JOB_TTL_PURGE, Progress, run_job
from memories.models import JobRun, Memory
from memoryhub.errors import InvalidInput

logger = logging.getLogger(__name__)

TTL_BATCH_SIZE = 1_000


# --- TTL --------------------------------------------------------------------------------------


def _ttl_batches(*, now: datetime, batch_size: int, counts: dict[str, Any], progress: Progress | None) -> None:
    from memories.services import stack_usage_adjust

    counts.update(purged=0, batches=0)
    # Job runs expire too: the TTL job runs every few minutes, so keep a month of history.
    pruned, _ = JobRun.objects.filter(started_at__lt=now - JOB_RUN_RETENTION).exclude(
        status=JobRun.Status.RUNNING).delete()
    if pruned:
        counts["job_runs_pruned"] = pruned
    while True:
        with transaction.atomic():
            # SKIP LOCKED: a row a push is changing right now waits for the next run, not the push.
            ids = list(
                Memory.objects.filter(expires_at__lte=now).order_by("expires_at", "id")
                .select_for_update(skip_locked=True).values_list("id", flat=True)[:batch_size]
            )
            if not ids:
                return
            # Usage counts rows not soft-deleted (a sync delete already took them off the counters).
            usage = (Memory.objects.filter(pk__in=ids, deleted_at__isnull=True).values("stack_id")
                     .annotate(rows=Count("id"), size=Sum("size_bytes")).order_by("stack_id"))
            for stack_usage in usage:
                stack_usage_adjust(stack_id=stack_usage["stack_id"], count_delta=-stack_usage["rows"],
                                   bytes_delta=-(stack_usage["size"] or 0))
            # The ORM delete removes dependent rows (revisions, …) in set-based statements too.
            Memory.objects.filter(pk__in=ids).delete()
        counts["purged"] += len(ids)
        counts["batches"] += 1
        if progress is not None:
            progress(len(ids))
        if len(ids) < batch_size:
            return


def ttl_purge(*, now: datetime | None = None, batch_size: int = TTL_BATCH_SIZE,
              progress: Progress | None = None) -> JobRun:
    """Delete memories whose `expires_at` has passed (reads already hide them from that instant).

    Bounded batches, one transaction each; stack usage counters move down after commit. Also drops
    job runs older than `JOB_RUN_RETENTION`. Counts: purged, batches (, job_runs_pruned).
    """
    if batch_size < 1:
        raise InvalidInput("batch_size must be positive.", fields={"batch_size": ["Must be at least 1."]})
    at = now or timezone.now()
    return run_job(JOB_TTL_PURGE, lambda counts: _ttl_batches(now=at, batch_size=batch_size, counts=counts,
                                                              progress=progress))


def expired_count(*, now: datetime | None = None) -> int:
    return Memory.objects.filter(expires_at__lte=now or timezone.now()).count()


def live_memory_estimate() -> int:
    """Planner's row estimate of the memory table (cheap; for progress bars)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT GREATEST(reltuples, 0)::bigint FROM pg_class WHERE oid = 'memories_memory'::regclass")
        row = cursor.fetchone()
    return int(row[0]) if row else 0

