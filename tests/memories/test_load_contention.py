"""A load never waits for (or deadlocks with) a writer holding one of its memories."""

from __future__ import annotations

import threading
import time

import pytest

from memories.models import Memory
from memories.reads import load
from memories.services import memory_create
from tests.factories import make_org, make_stack, other_connection

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_load_skips_counting_a_memory_a_writer_holds_instead_of_waiting() -> None:
    stack = make_stack(make_org(), "contended")
    held = memory_create(stack=stack, kind="note", source="test", payload={"content": "fractions with pizza"})
    free = memory_create(stack=stack, kind="note", source="test", payload={"content": "decimals on a ruler"})
    # The suite may have a Celery worker running, which embeds these two right after their commit and
    # briefly locks each row to store its vector: let that finish first (bounded; with no worker
    # nothing embeds and this just waits out its bound), so the only lock is the one taken below.
    deadline = time.monotonic() + 3
    while (time.monotonic() < deadline
           and Memory.objects.filter(pk__in=[held.pk, free.pk], embedded_version__isnull=True).exists()):
        time.sleep(0.05)
    writer = other_connection()  # another process mid-write (the embedder storing a vector) holds a row lock
    try:
        writer.execute("SELECT 1 FROM memories_memory WHERE id = %s FOR NO KEY UPDATE", [held.pk])
        outcome: dict[str, object] = {}

        def run() -> None:
            try:
                outcome["ids"] = {item.id for item in load.stack_load(stack=stack, budget=8000).memories}
            except Exception as exc:  # reported below
                outcome["error"] = exc
            finally:
                from django.db import connection

                connection.close()

        thread = threading.Thread(target=run)
        thread.start()
        thread.join(10)
        assert not thread.is_alive(), "the load waited for the writer's row lock"
        assert "error" not in outcome, outcome
        assert outcome["ids"] == {str(held.pk), str(free.pk)}  # both returned…
    finally:
        writer.rollback()
        writer.close()
    counts = dict(Memory.objects.filter(stack=stack).values_list("id", "times_accessed"))
    assert counts == {held.pk: 0, free.pk: 1}  # …only the free one counted
