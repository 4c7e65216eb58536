"""Marks: short-lived flags the service's processes leave each other in Redis (docs/operations.md §8).

A mark is a key with an expiry, set again and again while its condition lasts, so a process that
stops saying so lets it lapse by itself. The web processes mark that requests are slowed and that
bulk work queues, the runner that embedding waits. Reads and writes are best effort on a client with
short timeouts: a Redis that cannot answer reads as "not marked", and costs a writer only its mark,
never the request or the runner's look it was made in.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import redis

TIMEOUT_SECONDS = 1


@functools.cache
def client(redis_url: str) -> redis.Redis:
    """The client for marks in `redis_url`, one a process (its pool is thread-safe and renews itself
    after a fork): connecting and each command give up after `TIMEOUT_SECONDS`."""
    return redis.Redis.from_url(redis_url, socket_connect_timeout=TIMEOUT_SECONDS, socket_timeout=TIMEOUT_SECONDS)


def set_mark(marks: redis.Redis, key: str, seconds: int) -> None:
    """Sets `key` to lapse after `seconds`; best effort."""
    with contextlib.suppress(redis.RedisError):
        marks.set(key, "1", ex=seconds)


def clear_mark(marks: redis.Redis, key: str) -> None:
    """Removes `key` at once; best effort (an unreachable Redis lets it lapse)."""
    with contextlib.suppress(redis.RedisError):
        marks.delete(key)


def is_marked(marks: redis.Redis, key: str) -> bool:
    """Whether `key` is set now; False when Redis cannot say."""
    try:
        return bool(marks.exists(key))
    except redis.RedisError:
        return False


def mark_reader(redis_url: str, key: str) -> Callable[[], bool]:
    """`is_marked` for one key (the runner's looks)."""
    return lambda: is_marked(client(redis_url), key)
