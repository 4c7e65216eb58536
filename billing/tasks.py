"""Celery tasks: thin wrappers over billing.services (the schedule is memoryhub/schedule.py).

Without a configured chain (no RPC URL or treasury) the chain tasks do nothing; with the node
down they log one warning and leave the work to the next run. Each is idempotent: claims and
activations happen under row locks and the claim constraint, so an overlapping run changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from celery import shared_task

from billing.services.lifecycle import expire_intents, lifecycle_run
from billing.services.payments import recheck_claimed, watch_treasury
from memoryhub.errors import BillingUnavailable, ChainUnavailable

logger = logging.getLogger(__name__)
T = TypeVar("T")


def _with_chain(name: str, work: Callable[[], T]) -> T | None:
    try:
        return work()
    except BillingUnavailable:
        return None  # payments not configured here: nothing to watch
    except ChainUnavailable:
        logger.warning("billing %s skipped: the chain node is unavailable", name)
        return None


@shared_task(name="billing.lifecycle", acks_late=True, ignore_result=True)
def lifecycle_task() -> dict[str, int]:
    """Daily: renewal warnings, grace, expiry to free, scheduled downgrades, expired intents."""
    return vars(lifecycle_run())


@shared_task(name="billing.payments_recheck", acks_late=True, ignore_result=True)
def payments_recheck_task() -> dict[str, int] | None:
    """Confirm claimed transfers once deep enough; catch reorgs before finality."""
    expire_intents()
    return _with_chain("re-check", recheck_claimed)


@shared_task(name="billing.treasury_watch", acks_late=True, ignore_result=True)
def treasury_watch_task() -> dict[str, int] | None:
    """Match the treasury's incoming transfers from linked wallets to open intents."""
    report = _with_chain("treasury watch", watch_treasury)
    return vars(report) if report is not None else None
