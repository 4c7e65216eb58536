"""Periodic lifecycle tasks (decay, TTL purge, promotion): thin wrappers over memories.lifecycle.

Each task is idempotent (the services compute from stored state and the time, and skip what is
already done), holds its job's advisory lock (an overlapping run records `skipped` and does
nothing), records a JobRun, and has soft/hard time limits. A soft limit stops the run between
batches; everything committed so far stays and the next run continues from the stored state.
`now` may be given as an ISO timestamp (operators replaying a run); default: the wall clock.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from celery import shared_task
from django.utils.dateparse import parse_datetime

from memories.lifecycle.decay_pass import decay_pass
from memories.lifecycle.promotion import promotion_run
from memories.lifecycle.ttl import ttl_purge


def _at(now: str | None) -> datetime | None:
    return parse_datetime(now) if now else None


@shared_task(name="memories.decay_pass", acks_late=True, soft_time_limit=15 * 60,
             time_limit=16 * 60)
def decay_pass_task(now: str | None = None) -> dict[str, Any]:
    """Recompute salience everywhere and tombstone what has faded."""
    return decay_pass(now=_at(now)).summary()


@shared_task(name="memories.ttl_purge", acks_late=True, soft_time_limit=5 * 60,
             time_limit=6 * 60)
def ttl_purge_task(now: str | None = None) -> dict[str, Any]:
    """Delete memories whose expiry time has passed (reads hide them already)."""
    return ttl_purge(now=_at(now)).summary()


@shared_task(name="memories.promotion_run", acks_late=True, soft_time_limit=15 * 60,
             time_limit=16 * 60)
def promotion_run_task(now: str | None = None) -> dict[str, Any]:
    """Promote recurring episode lessons to beliefs in stacks with new episodes."""
    return promotion_run(now=_at(now)).summary()
