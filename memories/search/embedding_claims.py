"""Claims on memories being embedded: short Redis leases, renewed while a batch is worked on.

A row is claimed with a short-lived Redis lock (`SET NX EX`) before it is embedded, so two
workers (an after-commit task and the periodic sweep, say) never embed the same row at once -
without holding a database row lock during inference, which would stall sync pushes. The claim
is a lease of CLAIM_SECONDS that a heartbeat thread renews every RENEW_SECONDS while the batch is
worked on: a worker killed mid-batch stops renewing, and its rows are free for the next task or
sweep within seconds (docs/algorithms.md §10.2). memories.search.embedding_jobs takes the claims.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from functools import cache

import redis
from django.conf import settings

logger = logging.getLogger(__name__)

CLAIM_SECONDS = 15  # the lease; renewed every RENEW_SECONDS while its batch is worked on
RENEW_SECONDS = 5.0
_CLAIM_PREFIX = "mh:embed:claim:"


@cache
def _redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=5)


def claim(ids: Sequence[str], token: str) -> list[str]:
    """The subset of `ids` this caller now holds (others are being embedded elsewhere)."""
    if not ids:
        return []
    pipe = _redis().pipeline(transaction=False)
    for memory_id in ids:
        pipe.set(_CLAIM_PREFIX + memory_id, token, nx=True, ex=CLAIM_SECONDS)
    return [memory_id for memory_id, ok in zip(ids, pipe.execute(), strict=True) if ok]


# Release only our own claims (a claim that expired and was re-taken belongs to someone else).
_RELEASE = """
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then redis.call('DEL', key) end
end
return 0
"""


def release(ids: Sequence[str], token: str) -> None:
    if ids:
        _redis().eval(_RELEASE, len(ids), *[_CLAIM_PREFIX + i for i in ids], token)


# Extend only our own claims.
_RENEW = """
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then redis.call('EXPIRE', key, ARGV[2]) end
end
return 0
"""


@contextlib.contextmanager
def lease_renewed(ids: Sequence[str], token: str) -> Iterator[None]:
    """Keep renewing our claims on `ids` until the block ends (then release them)."""
    stop = threading.Event()
    keys = [_CLAIM_PREFIX + i for i in ids]

    def renew() -> None:
        while not stop.wait(RENEW_SECONDS):
            try:
                _redis().eval(_RENEW, len(keys), *keys, token, str(CLAIM_SECONDS))
            except redis.RedisError as exc:  # the lease may lapse: the worst case is embedding twice
                logger.warning("embedding claims not renewed (%s)", type(exc).__name__)

    heartbeat = threading.Thread(target=renew, name="embedding-lease", daemon=True)
    heartbeat.start()
    try:
        yield
    finally:
        stop.set()
        heartbeat.join()
        release(ids, token)

