"""Celery tasks: thin wrappers over webhooks.dispatch (ids in, counts out). Both are idempotent."""

from __future__ import annotations

from celery import shared_task

from webhooks.dispatch import queue_run, sweep
from webhooks.services import deliveries_prune


@shared_task(name="webhooks.deliver", acks_late=True, ignore_result=True, soft_time_limit=20 * 60, time_limit=21 * 60)
def deliver_task(endpoint_id: int, stack_id: int | None) -> int:
    """Send one endpoint's due deliveries of one stack, in order (dispatch.queue_run)."""
    return queue_run(endpoint_id, stack_id)


@shared_task(name="webhooks.sweep", acks_late=True, ignore_result=True)
def sweep_task() -> int:
    """Periodic: queue the deliveries that are due and whose task was lost."""
    return sweep()


@shared_task(name="webhooks.prune", acks_late=True, ignore_result=True)
def prune_task() -> int:
    """Daily: delete the delivery log's finished entries older than 30 days."""
    return deliveries_prune()
