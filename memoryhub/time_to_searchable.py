"""Time to searchable: how long after its acknowledged write a memory's vector was stored, kept
where every process can read it (docs/algorithms.md §10.2.3, docs/operations.md §11).

The embedding pipeline (memories.search.embedding_jobs) runs in the worker, a process of its own,
maybe on another host. It observes each stored vector's wait — from the memory's
`server_updated_at` (the write the client was answered for) to the commit of its vector — in the
Prometheus histogram `memoryhub_time_to_searchable_seconds` (memoryhub.metrics, added up over one
host's processes), and hands the same samples to `record`, which keeps the latest of them in Redis:
per school and for the whole service, at most KEEP each, for WINDOW_SECONDS. Any web process reads
them back with `recent`: the overview's attention item (dashboard.overview) and the gauge
`memoryhub_time_to_searchable_recent_seconds` on /metrics.

A sample is (when stored, stack id, seconds): no memory id, no text. A reader of a school's samples
keeps only the stacks its caller may see (stacks.selectors.stacks_visible_to). Redis being down
loses samples and never fails an embedding.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from functools import cache
from typing import NamedTuple

import redis
from django.conf import settings

logger = logging.getLogger(__name__)

WINDOW_SECONDS = 15 * 60  # what "recent" means: samples stored in the last 15 minutes
KEEP = 1000  # the latest samples kept per school (and for the service): a p95 of up to 1,000 vectors
_SCHOOL_PREFIX = "mh:searchable:school:"
_SERVICE_KEY = "mh:searchable:service"


class Sample(NamedTuple):
    organization_id: int
    stack_id: int
    seconds: float


@cache
def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=2)


def _school_key(organization_id: int) -> str:
    return f"{_SCHOOL_PREFIX}{organization_id}"


def record(samples: Sequence[Sample], *, stored_at: float | None = None) -> None:
    """Keep `samples` (vectors stored at `stored_at`, epoch seconds; now by default) as the newest
    of their school's and the service's: one pipelined round trip (LPUSH, LTRIM, EXPIRE per list).
    Never raises: a lost sample only thins the window."""
    if not samples:
        return
    stored_at = time.time() if stored_at is None else stored_at
    by_key: dict[str, list[str]] = {}
    for sample in samples:
        entry = f"{stored_at:.3f}:{sample.stack_id}:{max(0.0, sample.seconds):.3f}"
        by_key.setdefault(_school_key(sample.organization_id), []).append(entry)
        by_key.setdefault(_SERVICE_KEY, []).append(entry)
    try:
        pipe = _redis().pipeline(transaction=False)
        for key, entries in by_key.items():
            pipe.lpush(key, *entries)
            pipe.ltrim(key, 0, KEEP - 1)
            pipe.expire(key, WINDOW_SECONDS)
        pipe.execute()
    except redis.RedisError as exc:
        logger.warning("time to searchable not recorded (%s)", type(exc).__name__)


def recent(organization_id: int | None, *, now: float | None = None) -> list[tuple[int, float]]:
    """(stack id, seconds) of the vectors stored in the last WINDOW_SECONDS, newest first (at most
    KEEP): of the school `organization_id`, or of the whole service for None. Empty when Redis
    cannot answer (logged)."""
    key = _SERVICE_KEY if organization_id is None else _school_key(organization_id)
    since = (time.time() if now is None else now) - WINDOW_SECONDS
    try:
        entries: list[bytes] = _redis().lrange(key, 0, KEEP - 1)  # type: ignore[assignment]  # a sync client
    except redis.RedisError as exc:
        logger.warning("time to searchable not read (%s)", type(exc).__name__)
        return []
    found = []
    for entry in entries:
        stored_at, stack_id, seconds = entry.decode().split(":")
        # Newest first, nearly: workers push their batches in the order they commit, give or take
        # a clock's difference between hosts, so every entry is looked at.
        if float(stored_at) >= since:
            found.append((int(stack_id), float(seconds)))
    return found


def quantile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q` quantile (0 < q <= 1) of `values`, which must not be empty: the smallest
    value that at least a `q` share of them does not exceed."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
