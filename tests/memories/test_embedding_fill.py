"""The after-commit embedding task fills a short batch with its stacks' backlog (issue 19;
docs/algorithms.md §10.2.1): a write of one memory no longer costs a whole store round of its own,
and the fill never reaches another stack, let alone another school's."""

from __future__ import annotations

from typing import Any

import pytest

from memories.models import Memory
from memories.search import embedding_jobs
from memories.search.embedding_jobs import _claim, _release, memories_embed
from memories.services import memory_create
from memories.tasks import embed_memories
from tests.factories import make_org, make_stack

pytestmark = pytest.mark.django_db

BATCH = 4


@pytest.fixture(autouse=True)
def _small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedding_jobs, "EMBED_BATCH_SIZE", BATCH)


def notes(stack: Any, count: int, label: str = "note") -> list[str]:
    return [str(memory_create(stack=stack, kind="note", payload={"content": f"{label} {i}"}, source="api").pk)
            for i in range(count)]


def awaiting(ids: list[str]) -> set[str]:
    return {str(pk) for pk in Memory.objects.filter(pk__in=ids, embedded_version__isnull=True)
            .values_list("pk", flat=True)}


def test_a_task_of_one_memory_embeds_a_full_batch_of_its_stack_and_nothing_of_another_school() -> None:
    stack = make_stack(make_org())
    mine = notes(stack, 2 * BATCH)
    other_school = notes(make_stack(make_org()), BATCH, "other school")
    other_student = notes(make_stack(stack.organization), BATCH, "other student")

    counts = embed_memories(ids=[mine[0]])

    assert (counts["embedded"], counts["filled"]) == (BATCH, BATCH - 1)
    assert len(awaiting(mine)) == BATCH and mine[0] not in awaiting(mine)
    # Another stack's backlog, in the same school or not, is that stack's tasks' to take.
    assert awaiting(other_school) == set(other_school)
    assert awaiting(other_student) == set(other_student)
    # The task of a memory an earlier task took still fills a batch: the rest of the backlog.
    taken = next(i for i in mine if i not in awaiting(mine) and i != mine[0])
    assert embed_memories(ids=[taken])["embedded"] == BATCH
    assert awaiting(mine) == set()


def test_the_fill_leaves_rows_another_worker_holds_and_frees_what_it_does_not_embed() -> None:
    stack = make_stack(make_org())
    ids = notes(stack, 3 * BATCH)
    held = ids[1:3]
    assert _claim(held, "other-worker") == held

    result = memories_embed(ids=[ids[0]], fill=True)

    assert (result.embedded, result.filled) == (BATCH, BATCH - 1)
    assert awaiting(held) == set(held)  # not embedded behind the other worker's back
    assert _claim(held, "third-worker") == []  # and its claims are still its own
    # Candidates claimed beyond the batch were released at once: the next worker can take them.
    left = sorted(awaiting(ids) - set(held))
    assert _claim(left, "next-worker") == left
    _release(left, "next-worker")
    _release(held, "other-worker")


def test_without_fill_only_the_given_memories_are_embedded() -> None:
    """The sweep and `manage.py reembed` choose their rows themselves: no fill."""
    stack = make_stack(make_org())
    ids = notes(stack, BATCH)
    result = memories_embed(ids=[ids[0]])
    assert (result.embedded, result.filled) == (1, 0)
    assert awaiting(ids) == set(ids[1:])
