"""Embedding waits out a flood of bulk work, for up to `EMBEDDING_HOLD_SECONDS` behind
(docs/operations.md §8, "Embedding waits out a flood").

The runner decides (memoryhub.worker_priority) and says so in Redis: `HOLD_KEY`, set with an expiry
at every look while the hold lasts, so a runner that stops looking releases it by itself. The worker
acts on it: `EmbeddingHold`, a step of Celery's consumer, looks every `LOOK_SECONDS` and stops taking
messages from the embedding queue while the key is set, then takes them again. The messages wait in
the broker and the memories in the backlog, in order: nothing is lost, only later. The task in hand
finishes; other queues (change events, webhooks, erasure, periodic jobs) are consumed throughout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import bootsteps

from memoryhub import redis_marks
from memoryhub.schedule import EMBEDDING_QUEUE

# Set by the runner while embedding waits; its expiry outlasts a few of the runner's looks.
HOLD_KEY = "mh:embedding:hold"
HOLD_KEY_SECONDS = 15
# How often the worker looks at HOLD_KEY.
LOOK_SECONDS = 1.0


def hold_writer(redis_url: str) -> Callable[[bool], None]:
    """Sets (True) or clears (False) the hold; best effort: Redis unreachable, the key lapses."""
    marks = redis_marks.client(redis_url)

    def set_held(held: bool) -> None:
        if held:
            redis_marks.set_mark(marks, HOLD_KEY, HOLD_KEY_SECONDS)
        else:
            redis_marks.clear_mark(marks, HOLD_KEY)

    return set_held


def embedding_held(redis_url: str | None = None) -> bool:
    """Whether embedding waits now; False when Redis cannot say (embedding goes on)."""
    if redis_url is None:
        from django.conf import settings

        redis_url = settings.REDIS_URL
    return redis_marks.is_marked(redis_marks.client(redis_url), HOLD_KEY)


class EmbeddingHold(bootsteps.StartStopStep):
    """A consumer step: the embedding queue is not consumed while the hold is set. It only gives
    back what it took: a queue cancelled by something else (a remote-control command) stays so."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.cancelled = False
        self.entry: Any = None

    def start(self, c: Any) -> None:
        from django.conf import settings

        marks = redis_marks.client(settings.REDIS_URL)

        def look() -> None:
            held = redis_marks.is_marked(marks, HOLD_KEY)
            if held and not self.cancelled and c.task_consumer.consuming_from(EMBEDDING_QUEUE):
                c.cancel_task_queue(EMBEDDING_QUEUE)
                self.cancelled = True
            elif not held and self.cancelled:
                # Selected again too, so that a consumer restarted later consumes it (cancelling
                # deselected it; adding alone would not select it back).
                queues = c.app.amqp.queues
                queues.select_add(queues[EMBEDDING_QUEUE])
                c.add_task_queue(EMBEDDING_QUEUE)
                self.cancelled = False

        self.entry = c.timer.call_repeatedly(LOOK_SECONDS, look)

    def stop(self, c: Any) -> None:
        if self.entry is not None:
            self.entry.cancel()
            self.entry = None
        # `cancelled` stays: a consumer restarted after a lost broker connection leaves the cancelled
        # queue out too (Celery deselected it), and the next look gives it back once the hold ends.
