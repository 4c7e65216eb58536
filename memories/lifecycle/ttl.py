"""TTL purge: memories whose `expires_at` has passed are deleted in bounded batches, and old
job runs are pruned.

A purge is a write like any other for the write kernel's after-commit effects (one
`MemoryChange("expire", source="ttl")` per stack and batch), but it picks its rows with SKIP LOCKED
before knowing their stacks, so it cannot take the stack lock first: its usage counters move after
commit (`memories.writes.rows.stack_usage_adjust`, the kernel's form for exactly this writer).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from memories.lifecycle.jobs import JOB_RUN_RETENTION, JOB_TTL_PURGE, Progress, run_job
from memories.models import JobRun, Memory
from memories.writes.hooks import after_commit
from memories.writes.rows import stack_usage_adjust
from memoryhub.errors import InvalidInput

logger = logging.getLogger(__name__)

TTL_BATCH_SIZE = 1_000
TTL_SOURCE = "ttl"


# --- TTL --------------------------------------------------------------------------------------


def _ttl_batches(*, now: datetime, batch_size: int, counts: dict[str, Any], progress: Progress | None) -> None:
    counts.update(purged=0, batches=0)
    # Job runs expire too: the TTL job runs every few minutes, so keep a month of history.
    pruned, _ = JobRun.objects.filter(started_at__lt=now - JOB_RUN_RETENTION).exclude(
        status=JobRun.Status.RUNNING).delete()
    if pruned:
        counts["job_runs_pruned"] = pruned
    while True:
        with transaction.atomic():
            # SKIP LOCKED: a row a push is changing right now waits for the next run, not the push.
            rows = list(
                Memory.objects.filter(expires_at__lte=now).order_by("expires_at", "id")
                .select_for_update(skip_locked=True).values_list("id", "stack_id", "deleted_at", "size_bytes")
                [:batch_size]
            )
            if not rows:
                return
            ids = [memory_id for memory_id, _, _, _ in rows]
            # The ORM delete removes dependent rows (revisions, …) in set-based statements too.
            Memory.objects.filter(pk__in=ids).delete()
            for stack_id, purged in _purged_by_stack(rows).items():
                stack_usage_adjust(stack_id=stack_id, count_delta=-purged.counted_rows,
                                   bytes_delta=-purged.counted_bytes)
                after_commit(stack_id=stack_id, source=TTL_SOURCE, changes=[("expire", purged.ids)])
        counts["purged"] += len(ids)
        counts["batches"] += 1
        if progress is not None:
            progress(len(ids))
        if len(ids) < batch_size:
            return


@dataclass
class _StackPurge:
    ids: list[Any] = field(default_factory=list)
    counted_rows: int = 0
    counted_bytes: int = 0


def _purged_by_stack(rows: Iterable[tuple[Any, int, datetime | None, int]]) -> dict[int, _StackPurge]:
    """(id, stack id, deleted_at, size_bytes) rows → what each stack lost. The usage counters count
    rows not soft-deleted (a sync delete already took them off the counters)."""
    stacks: dict[int, _StackPurge] = {}
    for memory_id, stack_id, deleted_at, size_bytes in rows:
        purge = stacks.setdefault(stack_id, _StackPurge())
        purge.ids.append(memory_id)
        if deleted_at is None:
            purge.counted_rows += 1
            purge.counted_bytes += size_bytes
    return stacks


def ttl_purge(*, now: datetime | None = None, batch_size: int = TTL_BATCH_SIZE,
              progress: Progress | None = None) -> JobRun:
    """Delete memories whose `expires_at` has passed (reads already hide them from that instant).

    Bounded batches, one transaction each; after each commits, the stacks' usage counters move
    down and the change listeners hear `MemoryChange("expire")` per stack. Also drops job runs older
    than `JOB_RUN_RETENTION`. Counts: purged, batches (, job_runs_pruned).
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

