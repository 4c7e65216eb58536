"""The lifecycle and search rooms write through the write kernel: a registered change listener
(`memories.writes.hooks.register_listener`, where live events plug in) hears every one of their
writes after commit — with the right stack, action, ids and source — and nothing of a write that
rolled back."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from memories.lifecycle.decay import Grade
from memories.lifecycle.decay_pass import decay_pass
from memories.lifecycle.promotion import promote_lessons
from memories.lifecycle.reviews import record_review
from memories.lifecycle.ttl import ttl_purge
from memories.models import Memory
from memories.search.retrieval_feedback import DEMOTE, PROMOTE, memory_feedback
from memories.search.smart_ingest import Thresholds, smart_ingest
from memories.services import memory_create
from memories.writes.hooks import MemoryChange, register_listener, unregister_listener
from stacks.models import Stack
from tests.actors import School

pytestmark = pytest.mark.django_db

NOW = timezone.now().replace(microsecond=0)
NOTE = "Alice learns fractions best when the teacher uses pizza slices and paper strips in class"

Heard = dict[tuple[int, str, str], set[str]]  # (stack id, action, source) -> memory ids


class Rollback(Exception):
    """Raised inside a transaction to roll it back."""


@pytest.fixture
def heard() -> Iterator[list[MemoryChange]]:
    changes: list[MemoryChange] = []
    register_listener(changes.append)
    yield changes
    unregister_listener(changes.append)


@pytest.fixture
def committed(django_capture_on_commit_callbacks: Any, heard: list[MemoryChange]) -> Callable[..., tuple[Any, Heard]]:
    """Run a write, check that nothing is heard before it commits, commit it (the on-commit
    callbacks of the test's transaction run) and return what the listener heard, by
    (stack, action, source); each of those heard once."""

    def run(write: Callable[[], Any]) -> tuple[Any, Heard]:
        heard.clear()
        with django_capture_on_commit_callbacks(execute=True):
            result = write()
            assert heard == [], "a listener heard of a write before it committed"
        keyed: Heard = {}
        for change in heard:
            key = (change.stack_id, change.action, change.source)
            assert key not in keyed, f"{key} heard twice for one write"
            keyed[key] = set(change.memory_ids)
        heard.clear()
        return result, keyed

    return run


@pytest.fixture
def rolled_back(django_capture_on_commit_callbacks: Any, heard: list[MemoryChange]) -> Callable[..., None]:
    """Run a write in a transaction that rolls back; the listener must hear nothing, ever."""

    def run(write: Callable[[], Any]) -> None:
        heard.clear()
        with django_capture_on_commit_callbacks(execute=True), pytest.raises(Rollback), transaction.atomic():
            write()
            raise Rollback
        assert heard == []

    return run


def faded_memory(stack: Stack, record_id: str, *, days_old: float = 300, **fields: Any) -> Memory:
    created = NOW - timedelta(days=days_old)
    return Memory.objects.create(stack=stack, kind="episode", record_id=record_id, text=record_id,
                                 created_at=created, server_updated_at=created, **fields)


def ids(*memories: Memory) -> set[str]:
    return {str(memory.pk) for memory in memories}


def test_decay_tombstones_are_heard_once_per_stack_with_the_ids_tombstoned(school: School, committed: Any,
                                                                           rolled_back: Any) -> None:
    alice = [faded_memory(school.stack, f"alice-{n}") for n in range(2)]
    bob = faded_memory(school.other_stack, "bob")
    faded_memory(school.stack, "fresh", days_old=0)

    rolled_back(lambda: decay_pass(now=NOW))
    assert not Memory.objects.filter(forgotten_at__isnull=False).exists()

    run, heard = committed(lambda: decay_pass(now=NOW))

    assert run.counts["forgotten"] == 3
    assert heard == {(school.stack.pk, "forget", "decay"): ids(*alice),
                     (school.other_stack.pk, "forget", "decay"): ids(bob)}


def test_ttl_purge_is_heard_per_stack_as_expire(school: School, committed: Any) -> None:
    now = timezone.now()
    alice = [faded_memory(school.stack, f"alice-{n}", days_old=0, expires_at=now - timedelta(minutes=n))
             for n in range(3)]
    bob = faded_memory(school.other_stack, "bob", days_old=0, expires_at=now - timedelta(hours=1),
                       deleted_at=now - timedelta(hours=2))  # soft-deleted first: still purged, still heard
    faded_memory(school.stack, "later", days_old=0, expires_at=now + timedelta(days=1))

    run, heard = committed(lambda: ttl_purge(now=now, batch_size=10))

    assert run.counts["purged"] == 4
    assert heard == {(school.stack.pk, "expire", "ttl"): ids(*alice),
                     (school.other_stack.pk, "expire", "ttl"): ids(bob)}


def test_ttl_purge_rolled_back_is_not_heard(school: School, rolled_back: Any) -> None:
    expired = faded_memory(school.stack, "expired", days_old=0, expires_at=timezone.now() - timedelta(minutes=1))
    rolled_back(lambda: ttl_purge(batch_size=10))
    assert Memory.objects.filter(pk=expired.pk).exists()


def test_smart_ingest_writes_and_decisions_are_heard(school: School, committed: Any, rolled_back: Any) -> None:
    stack = school.stack.pk
    rolled_back(lambda: smart_ingest(stack=school.stack, kind="note", payload={"content": NOTE}))

    created, heard = committed(lambda: smart_ingest(stack=school.stack, kind="note", payload={"content": NOTE}))
    assert created.decision == "create"
    assert heard == {(stack, "create", "ingest"): ids(created.memory)}

    reinforced, heard = committed(lambda: smart_ingest(stack=school.stack, kind="note", payload={"content": NOTE}))
    assert reinforced.decision == "reinforce" and reinforced.memory.version == 1  # decay state, not a change
    assert heard == {(stack, "reinforce", "ingest"): ids(created.memory)}

    belief = "Bob finds long division hard without squared paper"
    first, _ = committed(lambda: smart_ingest(stack=school.stack, kind="belief", payload={"statement": belief}))
    merged, heard = committed(lambda: smart_ingest(
        stack=school.stack, kind="belief", payload={"statement": belief + " at home"},
        thresholds=Thresholds(near_identical=0.99, update=0.5)))
    assert merged.decision == "update" and merged.memory.pk == first.memory.pk
    assert heard == {(stack, "update", "ingest"): ids(first.memory), (stack, "merge", "ingest"): ids(first.memory)}

    superseding, heard = committed(lambda: smart_ingest(
        stack=school.stack, kind="note", payload={"content": "Alice now prefers number lines"},
        supersedes=str(created.memory.pk)))
    assert superseding.decision == "supersede"
    assert heard == {(stack, "create", "ingest"): ids(superseding.memory),
                     (stack, "forget", "ingest"): ids(created.memory),
                     (stack, "superseded", "ingest"): ids(created.memory)}


def test_feedback_and_recall_are_heard(school: School, committed: Any, rolled_back: Any) -> None:
    memory = memory_create(stack=school.stack, kind="note", payload={"content": NOTE}, source="test")
    stack = school.stack.pk

    rolled_back(lambda: memory_feedback(memory=memory, action=PROMOTE))

    _, heard = committed(lambda: memory_feedback(memory=memory, action=PROMOTE))
    assert heard == {(stack, "promote", "feedback"): ids(memory)}
    _, heard = committed(lambda: memory_feedback(memory=memory, action=DEMOTE))
    assert heard == {(stack, "demote", "feedback"): ids(memory)}

    _, heard = committed(lambda: record_review(memory=memory, grade=Grade.GOOD, source="recall"))
    assert heard == {(stack, "review", "recall"): ids(memory)}
    assert Memory.objects.get(pk=memory.pk).version == 1  # feedback and reviews are decay state

    # Recalling a memory the decay pass tombstoned recovers it (a change) and reviews it.
    faded = faded_memory(school.stack, "faded")
    decay_pass(now=NOW)
    _, heard = committed(lambda: record_review(memory=faded, grade=Grade.GOOD, now=NOW, source="recall"))
    assert heard == {(stack, "recover", "recall"): ids(faded), (stack, "review", "recall"): ids(faded)}


def test_promotion_is_heard_as_created_beliefs(school: School, committed: Any, rolled_back: Any) -> None:
    for n in range(3):
        memory_create(stack=school.stack, kind="episode", source="test", record_id=f"e{n}",
                      payload={"objective": f"session {n}", "outcome": "ok", "lessons": ["Test first"]})

    rolled_back(lambda: promote_lessons(stack=school.stack, auto=True))

    result, heard = committed(lambda: promote_lessons(stack=school.stack, auto=True))

    assert result.created == 1
    assert heard == {(school.stack.pk, "create", "promotion"): {result.suggestions[0].belief_id}}
