"""The embedding backlog is worked round-robin across stacks, each stack's oldest change first
(docs/algorithms.md §10.2.2): one school's import of thousands of rows does not hold back another
school's few new rows until the import is done, neither in the sweep nor in a task's fill."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from memories.models import Memory
from memories.search import embedding_jobs
from memories.search.embedding_backlog import embedding_backlog_ids, embedding_sweep
from memories.search.embedding_jobs import memories_embed
from memories.services import memory_create
from tests.factories import make_org, make_stack

pytestmark = pytest.mark.django_db

BATCH = 2  # the sweep asks for 4 batches at a time: 8 rows


@pytest.fixture(autouse=True)
def _small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedding_jobs, "EMBED_BATCH_SIZE", BATCH)


def written(stack: Any, count: int, label: str, *, minutes_ago: float) -> list[str]:
    """`count` notes awaiting a vector, changed one second apart from `minutes_ago` on, in that order."""
    ids = [str(memory_create(stack=stack, kind="note", payload={"content": f"{label} {i}"}, source="api").pk)
           for i in range(count)]
    start = timezone.now() - timedelta(minutes=minutes_ago)
    for i, memory_id in enumerate(ids):
        Memory.objects.filter(pk=memory_id).update(server_updated_at=start + timedelta(seconds=i))
    return ids


def awaiting(ids: list[str]) -> list[str]:
    waiting = {str(pk) for pk in Memory.objects.filter(pk__in=ids, embedded_version__isnull=True)
               .values_list("pk", flat=True)}
    return [i for i in ids if i in waiting]


def test_one_sweep_batch_takes_another_schools_few_rows_beside_an_older_import() -> None:
    importing = written(make_stack(make_org()), 20, "imported", minutes_ago=30)
    few = written(make_stack(make_org()), 3, "new", minutes_ago=1)

    # Turns across the stacks, each stack's oldest first: the import's first row (the oldest of
    # all), the other school's first, the import's second, ...; the import's rest after.
    assert embedding_backlog_ids(limit=8) == [importing[0], few[0], importing[1], few[1], importing[2], few[2],
                                              importing[3], importing[4]]

    result = embedding_sweep(max_rows=8)  # one round of the sweep: 8 rows

    assert result.embedded == 8
    assert awaiting(few) == []  # searchable by meaning now, not after the 20 older rows
    assert awaiting(importing) == importing[5:]  # the import goes on from its oldest


def test_the_backlog_order_leaves_out_the_rows_asked_to_be_left_out() -> None:
    """The sweep passes the rows it already tried (held by another worker, or stale): the next
    rows in turn come instead, so a batch is not cut short by them."""
    first = written(make_stack(make_org()), 3, "first", minutes_ago=10)
    second = written(make_stack(make_org()), 2, "second", minutes_ago=5)
    assert embedding_backlog_ids(limit=3, exclude=[first[0], second[0]]) == [first[1], second[1], first[2]]


def test_a_tasks_fill_takes_each_stacks_oldest_rows_in_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    """A task whose ids span two stacks fills its short batch from both stacks' backlogs in turns,
    each stack's oldest change first, not from whichever rows the index happens to give first."""
    monkeypatch.setattr(embedding_jobs, "EMBED_BATCH_SIZE", 6)
    org = make_org()
    big = written(make_stack(org), 6, "big", minutes_ago=30)
    small = written(make_stack(org), 4, "small", minutes_ago=20)
    # Inserted first but changed last: an unordered fill would find these first.
    now = timezone.now()
    Memory.objects.filter(pk=big[0]).update(server_updated_at=now - timedelta(seconds=1))
    Memory.objects.filter(pk=big[1]).update(server_updated_at=now)

    result = memories_embed(ids=[big[5], small[3]], fill=True)

    assert (result.embedded, result.filled) == (6, 4)
    # In turns, oldest change first: big 2 and small 0, then big 3 and small 1.
    assert awaiting(big) == [big[0], big[1], big[4]]
    assert awaiting(small) == [small[2]]
