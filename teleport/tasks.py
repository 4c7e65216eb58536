"""Celery tasks: thin wrappers over teleport.services (counts out)."""

from __future__ import annotations

from celery import shared_task

from teleport.services import snapshots_purge


@shared_task(name="teleport.purge", acks_late=True, ignore_result=True)
def purge_task() -> dict[str, int]:
    """Periodic: remove expired snapshots and codes, and blobs no snapshot names (idempotent)."""
    return snapshots_purge()
