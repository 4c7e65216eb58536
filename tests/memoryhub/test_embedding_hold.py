"""Embedding waits out a peak of requests (memoryhub/embedding_hold.py; docs/operations.md §8): a real
worker takes no embedding task while the hold is set, goes on with its other queues, and embeds what
waited once the hold ends. Nothing is lost."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.db import transaction

from memories.models import Memory
from memories.services import memory_create
from memoryhub.embedding_hold import HOLD_KEY, LOOK_SECONDS, embedding_held, hold_writer
from memoryhub.tasks import ping
from tests.factories import make_org, make_stack

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def hold(settings: Any) -> Iterator[Any]:
    """The runner's writer of the hold, against the test Redis; the hold is lifted after the test,
    and the worker given the time to take its queue back before `celery_worker` stops it."""
    set_held = hold_writer(settings.REDIS_URL)
    yield set_held
    set_held(False)
    time.sleep(1.5 * LOOK_SECONDS)


def vector_stored(memory: Memory, *, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        memory.refresh_from_db()
        if memory.embedded_version is not None:
            return True
        time.sleep(0.2)
    return False


def test_a_held_worker_embeds_nothing_and_everything_once_the_hold_ends(celery_worker: Any, hold: Any,
                                                                        settings: Any) -> None:
    hold(True)
    assert embedding_held()
    time.sleep(2.5)  # the worker looks every second: it has stopped taking embedding tasks
    stack = make_stack(make_org())
    with transaction.atomic():
        memories = [memory_create(stack=stack, kind="note", payload={"content": f"Fractions {i}"}, source="api")
                    for i in range(3)]
    # Its other queues are consumed throughout: a task on the default queue is answered.
    assert ping.delay().get(timeout=20) == "pong"
    assert not vector_stored(memories[0], within=4)
    assert Memory.objects.filter(pk__in=[m.pk for m in memories], embedded_version__isnull=True).count() == 3

    hold(False)
    assert all(vector_stored(memory, within=30) for memory in memories)


def test_the_hold_carries_an_expiry_so_it_lapses_unless_the_runner_renews_it(settings: Any, hold: Any) -> None:
    hold(True)
    ttl = int(redis.Redis.from_url(settings.REDIS_URL).ttl(HOLD_KEY))  # type: ignore[arg-type]
    assert 0 < ttl <= 15
    hold(False)
    assert not embedding_held()


def test_redis_that_cannot_answer_holds_nothing_back() -> None:
    assert embedding_held("redis://127.0.0.1:1/0") is False
    hold_writer("redis://127.0.0.1:1/0")(True)  # best effort: no error for the runner
