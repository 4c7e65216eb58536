"""TTL purge: memories whose `expires_at` has passed are deleted in bounded batches, memories older
than their school's retention for their kind (`Organization.retention_days`) likewise, and old job
runs are pruned (docs/algorithms.md §4).

Each purged memory leaves the erasure's id-only tombstone (an `ErasedRecord`), so the sync engine
refuses a device's re-push of it (docs/kernle-protocol.md §4.6). A purge is a write like any other
for the write kernel's after-commit effects (one
`MemoryChange("expire", source="ttl")` per stack and batch), but it picks its rows with SKIP LOCKED
before knowing their stacks, so it cannot take the stack lock first: its usage counters move after
commit (`memories.writes.rows.stack_usage_adjust`, the kernel's form for exactly this writer).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from accounts.models import Organization, default_retention_days
from accounts.principal import Principal
from accounts.services import audit_record
from memories.lifecycle.jobs import JOB_RUN_RETENTION, JOB_TTL_PURGE, Progress, run_job
from memories.models import JobRun, Memory, MemoryKind
from memories.reads.access_history import access_log_purge
from memories.writes.hooks import after_commit
from memories.writes.rows import stack_usage_adjust
from memoryhub.errors import InvalidInput
from stacks.models import Stack

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
    _purge_batches(Memory.objects.filter(expires_at__lte=now).order_by("expires_at", "id"), batch_size=batch_size,
                   counts=counts, progress=progress)
    _retention_batches(now=now, batch_size=batch_size, counts=counts, progress=progress)
    # The access log is kept for each school's own `access_log_retention_days` (docs/privacy.md "Access log").
    access_purged = access_log_purge(now=now)
    if access_purged:
        counts["access_log_purged"] = access_purged


def _purge_batches(selection: QuerySet[Memory], *, batch_size: int, counts: dict[str, Any],
                   progress: Progress | None, counter: str = "purged") -> None:
    """Delete the rows of `selection` in bounded batches, one transaction each, as the kernel's
    purge form: counters moved with `stack_usage_adjust`, `MemoryChange("expire")` after commit."""
    while True:
        with transaction.atomic():
            # Every writer's lock order: the stack rows, then memory rows (memories.writes.rows).
            # Holding the stack lock makes this batch's "purge" events commit in seq order with the
            # stack's other writes (memories.writes.outbox). SKIP LOCKED: a stack or row a push is changing
            # right now waits for the next run, not the push.
            candidates = set(selection.values_list("stack_id", flat=True)[:batch_size])
            stacks = list(Stack.objects.select_for_update(no_key=True, skip_locked=True)
                          .filter(pk__in=candidates).order_by("pk").values_list("pk", flat=True))
            rows = list(
                selection.filter(stack_id__in=stacks).select_for_update(skip_locked=True, of=("self",))
                .values_list("id", "stack_id", "deleted_at", "size_bytes")[:batch_size]
            ) if stacks else []
            if not rows:
                return
            ids = [memory_id for memory_id, _, _, _ in rows]
            _leave_tombstones(ids, stacks)
            # The ORM delete removes dependent rows (revisions, …) in set-based statements too.
            Memory.objects.filter(pk__in=ids).delete()
            for stack_id, purged in _purged_by_stack(rows).items():
                stack_usage_adjust(stack_id=stack_id, count_delta=-purged.counted_rows,
                                   bytes_delta=-purged.counted_bytes)
                after_commit(stack_id=stack_id, source=TTL_SOURCE, changes=[("expire", purged.ids)])
        counts[counter] = counts.get(counter, 0) + len(ids)
        counts["batches"] += 1
        if progress is not None:
            progress(len(ids))
        if len(ids) < batch_size:
            return


# A purged memory stays purged: the erasure's own id-only tombstone (memories.privacy.tombstones, the
# same expression), so a device re-pushing its old copy is refused instead of bringing it back.
_TOMBSTONES_SQL = """
INSERT INTO memories_erasedrecord (stack_id, key_hash)
SELECT stack_id, encode(sha256(convert_to(kind || ':' || record_id, 'UTF8')), 'hex')
FROM memories_memory WHERE id = ANY(%s)
ON CONFLICT DO NOTHING
"""


def _leave_tombstones(ids: list[Any], stacks: list[int]) -> None:
    """Tombstone the rows about to be purged (caller holds their stacks' and rows' locks). The
    stacks are flagged under those locks, so every later push looks the tombstones up."""
    with connection.cursor() as cursor:
        cursor.execute(_TOMBSTONES_SQL, [ids])
    Stack.objects.filter(pk__in=stacks, has_erasures=False).update(has_erasures=True)


# --- retention per kind ----------------------------------------------------------------------------

# What a new school keeps: a finite limit for every kind (the model's default; docs/privacy.md
# "Retention policy"). A stored {} — a school created before these defaults, or an admin's deliberate
# choice — keeps everything until a memory's own `expires_at` or an erasure.
DEFAULT_RETENTION_DAYS: dict[str, int] = default_retention_days()
RETENTION_MAX_DAYS = 36_500  # a hundred years: anything longer is a typo, not a policy


def retention_validated(value: Any) -> dict[str, int]:
    """A retention policy, {kind: days}, checked: known kinds, whole days 1..RETENTION_MAX_DAYS."""
    if not isinstance(value, dict):
        raise InvalidInput("The retention policy must be an object of kind: days.", code="invalid_retention",
                           fields={"retention_days": ["Expected an object such as {\"raw\": 365}."]})
    errors: dict[str, list[str]] = {}
    policy: dict[str, int] = {}
    for kind, days in value.items():
        if kind not in MemoryKind.values:
            errors[str(kind)] = [f"Unknown memory kind; one of: {', '.join(MemoryKind.values)}."]
        elif isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= RETENTION_MAX_DAYS:
            errors[kind] = [f"Whole days from 1 to {RETENTION_MAX_DAYS}."]
        else:
            policy[kind] = days
    if errors:
        raise InvalidInput("The retention policy is invalid.", code="invalid_retention", fields=errors)
    return policy


def retention_of(organization: Organization) -> dict[str, int]:
    return dict(organization.retention_days or {})


def retention_needs_review(organization: Organization) -> bool:
    """A kind without a limit that no admin has chosen yet (a school from before the finite
    defaults): the overview asks an admin to set retention, or to confirm "no limit"."""
    unlimited = set(MemoryKind.values) - set(organization.retention_days or {})
    return bool(unlimited) and organization.retention_reviewed_at is None


@transaction.atomic
def retention_set(*, organization: Organization, policy: Any, principal: Principal | None = None,
                  ip: str | None = None) -> dict[str, int]:
    """Replace a school's retention policy (caller checked it may manage the organization). Audited;
    the next TTL run enforces it."""
    days = retention_validated(policy)
    organization.retention_days = days
    organization.retention_reviewed_at = timezone.now()  # what it leaves unlimited is now chosen
    # post_save: the key cache forgets the old school
    organization.save(update_fields=["retention_days", "retention_reviewed_at"])
    audit_record(organization=organization, action="retention.updated", principal=principal,
                 target_type="organization", target_id=organization.slug, ip=ip, metadata={"retention_days": days})
    return days


def _retention_batches(*, now: datetime, batch_size: int, counts: dict[str, Any], progress: Progress | None) -> None:
    """Purge, per school and kind, memories created longer ago than the school keeps that kind.
    Set-based per (school, kind): the stacks are a subquery, so only memory rows are locked."""
    policies = (Organization.objects.exclude(retention_days={}).exclude(retention_days__isnull=True)
                .values_list("pk", "retention_days"))
    for organization_id, policy in policies.iterator():
        for kind, days in sorted((policy or {}).items()):
            if kind not in MemoryKind.values or isinstance(days, bool) or not isinstance(days, int) or days < 1:
                continue  # only retention_set writes the column; never purge on a value it would refuse
            stacks = Stack.objects.filter(organization_id=organization_id).values("pk")
            selection = Memory.objects.filter(stack_id__in=stacks, kind=kind,
                                              created_at__lt=now - timedelta(days=days)).order_by("created_at", "id")
            _purge_batches(selection, batch_size=batch_size, counts=counts, progress=progress,
                           counter="retention_purged")


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
    """Delete memories whose `expires_at` has passed (reads already hide them from that instant),
    then those older than their school's retention for their kind (`retention_days`).

    Bounded batches, one transaction each; after each commits, the stacks' usage counters move
    down and the change listeners hear `MemoryChange("expire")` per stack. Also drops job runs older
    than `JOB_RUN_RETENTION`, and access-log rows older than their school's `access_log_retention_days`.
    Counts: purged, batches (, retention_purged, job_runs_pruned, access_log_purged).
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

