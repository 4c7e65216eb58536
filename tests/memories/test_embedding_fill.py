"""The after-commit embedding task fills a short batch with its stacks' backlog
(docs/algorithms.md §10.2.1): a write of one memory no longer costs a whole store round of its own,
and the fill never reaches another stack, let alone another school's."""

from __future__ import annotations

from typing import Any

import pytest

from memories.models import Memory
from memories.search import embedding_jobs
from memories.search.embedding_claims import claim, release
from memories.search.embedding_jobs import memories_embed
from memories.services import memory_create
from memories.tasks import embed_memories
from memories.writes import hooks
from memoryhub.celery import app as celery_app
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
    assert claim(held, "other-worker") == held

    result = memories_embed(ids=[ids[0]], fill=True)

    assert (result.embedded, result.filled) == (BATCH, BATCH - 1)
    assert awaiting(held) == set(held)  # not embedded behind the other worker's back
    assert claim(held, "third-worker") == []  # and its claims are still its own
    # Candidates claimed beyond the batch were released at once: the next worker can take them.
    left = sorted(awaiting(ids) - set(held))
    assert claim(left, "next-worker") == left
    release(left, "next-worker")
    release(held, "other-worker")


def test_without_fill_only_the_given_memories_are_embedded() -> None:
    """The sweep and `manage.py reembed` choose their rows themselves: no fill."""
    stack = make_stack(make_org())
    ids = notes(stack, BATCH)
    result = memories_embed(ids=[ids[0]])
    assert (result.embedded, result.filled) == (1, 0)
    assert awaiting(ids) == set(ids[1:])


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[str], dict[str, Any]]]:
    """The embedding messages the writes and tasks send (ids, kwargs); none reaches the broker."""
    messages: list[tuple[list[str], dict[str, Any]]] = []

    def send_task(name: str, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None, **options: Any) -> None:
        assert name == hooks.EMBED_TASK
        messages.append((list(args[0]), dict(kwargs or {})))

    monkeypatch.setattr(celery_app, "send_task", send_task)
    return messages


def test_small_writes_of_a_stack_share_its_waiting_message(sent: list[tuple[list[str], dict[str, Any]]],
                                                           django_capture_on_commit_callbacks: Any) -> None:
    """One waiting message per stack (memories.writes.hooks): under the soak one message per write grew
    the queue without bound while most of them found their rows embedded already."""
    stack, other = make_stack(make_org()), make_stack(make_org())
    with django_capture_on_commit_callbacks(execute=True):
        first = notes(stack, 1, "first")
    with django_capture_on_commit_callbacks(execute=True):
        second = notes(stack, 2, "second")  # the stack's message is still waiting: nothing sent
    with django_capture_on_commit_callbacks(execute=True):
        elsewhere = notes(other, 1, "other school")  # another stack has its own message
    assert sent == [(first, {"stack_id": stack.pk}), (elsewhere, {"stack_id": other.pk})]

    # The waiting message's task embeds the rows of the writes it stood for, from the stack's backlog.
    assert embed_memories(sent[0][0], **sent[0][1])["embedded"] == 3
    assert awaiting(first + second) == set() and awaiting(elsewhere) == set(elsewhere)
    # Once it has started, the stack's next small write sends a message again.
    with django_capture_on_commit_callbacks(execute=True):
        third = notes(stack, 1, "third")
    assert sent[2:] == [(third, {"stack_id": stack.pk})]


def test_a_task_sends_its_stacks_next_message_for_what_its_batch_left(
        sent: list[tuple[list[str], dict[str, Any]]]) -> None:
    stack = make_stack(make_org())
    ids = notes(stack, 3 * BATCH)

    counts = embed_memories(ids=[ids[0]], stack_id=stack.pk)

    assert counts["embedded"] == BATCH
    # The rest of the stack's backlog (beyond the fill's look-ahead) goes into one next message of its own.
    assert len(sent) == 1 and sent[0][1] == {"stack_id": stack.pk}
    assert set(sent[0][0]) <= awaiting(ids) and len(sent[0][0]) == counts["left_over"] > 0
    while sent:
        message_ids, kwargs = sent.pop(0)
        embed_memories(message_ids, **kwargs)
    assert awaiting(ids) == set()
