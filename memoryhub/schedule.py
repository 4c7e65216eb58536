"""The Celery beat schedule, in code: periodic jobs and how often they run."""

from __future__ import annotations

from typing import Any

from celery.schedules import crontab

BEAT_SCHEDULE: dict[str, dict[str, Any]] = {}

# Periodic runs go to their own queue, which every worker consumes beside the default one
# (`--queues celery,periodic,embedding`, memoryhub/runner.py). The broker takes from a worker's queues in
# turn, so a sweep waits for at most the task in hand, not behind thousands of queued embedding
# tasks (on one queue, sweeps expired in line behind them). Tasks sent by code keep the default,
# but for the embedding tasks.
PERIODIC_QUEUE = "periodic"
# The after-commit embedding tasks have a queue of their own, which a worker stops consuming while
# embedding waits out a peak of requests (memoryhub.embedding_hold).
EMBEDDING_QUEUE = "embedding"
TASK_ROUTES = {"memories.embed_memories": {"queue": EMBEDDING_QUEUE}}
WORKER_QUEUES = f"celery,{PERIODIC_QUEUE},{EMBEDDING_QUEUE}"  # "celery": Celery's default queue, which we keep


def on_periodic_queue(schedule: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The schedule with every entry sent to PERIODIC_QUEUE (applied in memoryhub/celery.py, so
    entries added anywhere below are covered)."""
    return {name: {**entry, "options": {**entry.get("options", {}), "queue": PERIODIC_QUEUE}}
            for name, entry in schedule.items()}

# Embed whatever the after-commit embedding tasks missed (dead worker, broker blip, model change).
BEAT_SCHEDULE["memories-embedding-sweep"] = {
    "task": "memories.embedding_sweep",
    "schedule": 60.0,
    "options": {"expires": 55},
}

# Lifecycle jobs (memories/lifecycle/tasks.py). Each holds an advisory lock, so a run that starts
# while the previous one is still going records `skipped` and does nothing. `expires` drops a
# queued run that could not start before the next one is due anyway.
# Decay: salience moves slowly (days), so hourly is plenty; rows that barely changed are not
# rewritten, so an hourly pass costs little more than a daily one.
BEAT_SCHEDULE["memories-decay-pass"] = {
    "task": "memories.decay_pass",
    "schedule": crontab(minute=17),
    "options": {"expires": 50 * 60},
}
# TTL: reads hide expired rows at their exact time; the purge only reclaims the space.
BEAT_SCHEDULE["memories-ttl-purge"] = {
    "task": "memories.ttl_purge",
    "schedule": 5 * 60.0,
    "options": {"expires": 4 * 60},
}
# Promotion: only stacks with episodes written since the last run are scanned.
BEAT_SCHEDULE["memories-promotion-run"] = {
    "task": "memories.promotion_run",
    "schedule": crontab(minute=47),
    "options": {"expires": 50 * 60},
}
# Large stacks get their own partial HNSW index (memories.search.vector_indexes); one build per run.
BEAT_SCHEDULE["memories-stack-vector-indexes"] = {
    "task": "memories.stack_vector_indexes",
    "schedule": 10 * 60.0,
    "options": {"expires": 9 * 60},
}

# The guardians' weekly digest (memories.governance.guardian_digest): Monday morning, UTC.
BEAT_SCHEDULE["memories-guardian-digest"] = {
    "task": "memories.guardian_digest",
    "schedule": crontab(minute=5, hour=6, day_of_week="mon"),
    "options": {"expires": 6 * 60 * 60},
}

# Change events (memories.changes.publish): a writer publishes its own after commit; the relay publishes
# what it could not (Redis down, a consumer failing), so live pages and webhooks catch up within
# seconds. A queued run older than its period is dropped: the next one does the same work.
BEAT_SCHEDULE["memories-events-relay"] = {
    "task": "memories.events_relay",
    "schedule": 5.0,
    "options": {"expires": 5},
}
# Published events older than 7 days are deleted (consumers resume within that window).
BEAT_SCHEDULE["memories-events-prune"] = {
    "task": "memories.events_prune",
    "schedule": crontab(minute=23),
    "options": {"expires": 50 * 60},
}

# Webhooks: deliveries are sent by after-commit tasks and their retries by countdown tasks; this
# sweep re-queues whatever is due and was missed (a lost broker message, a dead worker)
# (webhooks/dispatch.py). Every 10 s: a dead worker's delivery is free once its 15 s lease lapses,
# and is sent again within seconds of that.
BEAT_SCHEDULE["webhooks-sweep"] = {
    "task": "webhooks.sweep",
    "schedule": 10.0,
    "options": {"expires": 9},
}
# The delivery log keeps 30 days (webhooks.services.DELIVERY_LOG_RETENTION); older finished
# deliveries are deleted once a day.
BEAT_SCHEDULE["webhooks-prune"] = {
    "task": "webhooks.prune",
    "schedule": crontab(hour=3, minute=41),
    "options": {"expires": 60 * 60},
}

# Billing (billing/tasks.py; docs/billing.md §5). The lifecycle runs daily: renewal warnings 3 days
# ahead, grace after an unpaid renewal, expiry to free, scheduled downgrades. Claimed transfers
# are re-checked until confirmed and then until final (reorgs); the treasury watcher matches
# transfers from linked wallets to open intents, so paying needs no pasted hash.
BEAT_SCHEDULE["billing-lifecycle"] = {
    "task": "billing.lifecycle",
    "schedule": crontab(hour=3, minute=7),
    "options": {"expires": 12 * 3600},
}
BEAT_SCHEDULE["billing-payments-recheck"] = {
    "task": "billing.payments_recheck",
    "schedule": 15.0,
    "options": {"expires": 14},
}
BEAT_SCHEDULE["billing-treasury-watch"] = {
    "task": "billing.treasury_watch",
    "schedule": 10.0,
    "options": {"expires": 9},
}

# Teleport (teleport/services.py): expired snapshots and codes are removed, with their blobs and
# quota bytes; blobs no snapshot names are removed after an hour. Readers already ignore expired ones.
BEAT_SCHEDULE["teleport-purge"] = {
    "task": "teleport.purge",
    "schedule": crontab(minute=29),
    "options": {"expires": 50 * 60},
}
