"""The written-out memory reads a live page makes for every change (memories.selectors
`memories_named`, `memories_by_id`) give what the ORM's rules give: live_q, the privacy grants."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models import BooleanField, ExpressionWrapper
from django.forms.models import model_to_dict
from django.utils import timezone

from memories.models import Memory
from memories.privacy.grants import Audience, grants_filter
from memories.selectors import live_q, memories_by_id, memories_named
from memories.services import memory_create
from stacks.models import Stack
from tests.factories import make_org, make_stack

pytestmark = pytest.mark.django_db


def note(stack: Stack, content: str) -> Memory:
    return memory_create(stack=stack, kind="note", payload={"content": content}, source="api")


def test_named_memories_are_the_orms_answer_for_liveness_and_grants() -> None:
    org = make_org()
    stack, other = make_stack(org, "s1"), make_stack(org, "s2")
    live, deleted, expired, forgotten, unexpired, private, open_ = (note(stack, f"m{n}") for n in range(7))
    foreign = note(other, "another stack's")
    now = timezone.now()
    Memory.objects.filter(pk=deleted.pk).update(deleted_at=now)
    Memory.objects.filter(pk=expired.pk).update(expires_at=now - timedelta(minutes=1))
    Memory.objects.filter(pk=unexpired.pk).update(expires_at=now + timedelta(days=1))
    Memory.objects.filter(pk=forgotten.pk).update(forgotten_at=now)
    Memory.objects.filter(pk=private.pk).update(access_grants=["human:someone_else"])
    Memory.objects.filter(pk=open_.pk).update(access_grants=["role:teacher"])
    ids = [str(m.pk) for m in (live, deleted, expired, forgotten, unexpired, private, open_, foreign)]
    audiences = [None, Audience(entity_ids=("role:teacher",), empty_admits=True),
                 Audience(entity_ids=("role:teacher",), empty_admits=False)]
    for audience in audiences:
        expected = set(grants_filter(Memory.objects.filter(stack_id=stack.pk, pk__in=ids), audience)
                       .annotate(live=ExpressionWrapper(live_q(), output_field=BooleanField()))
                       .values_list("pk", "created_at", "live"))
        assert set(memories_named(stack_id=stack.pk, ids=ids, audience=audience)) == expected, audience
    assert {(pk, is_live) for pk, _, is_live in memories_named(stack_id=stack.pk, ids=ids, audience=None)} == {
        (live.pk, True), (deleted.pk, False), (expired.pk, False), (forgotten.pk, True), (unexpired.pk, True),
        (private.pk, True), (open_.pk, True)}  # never another stack's
    only_granted = memories_named(stack_id=stack.pk, ids=ids, audience=audiences[2])
    assert [pk for pk, _, _ in only_granted] == [open_.pk]
    assert memories_named(stack_id=stack.pk, ids=[], audience=None) == []


def test_memories_by_id_reads_whole_rows_of_the_stack_only() -> None:
    org = make_org()
    stack, other = make_stack(org, "s1"), make_stack(org, "s2")
    mine, foreign = note(stack, "mine"), note(other, "not mine")
    [found] = memories_by_id(stack_id=stack.pk, ids=[mine.pk, foreign.pk])
    expected = Memory.objects.defer("embedding", "search_vector").get(pk=mine.pk)
    assert model_to_dict(found, exclude=["embedding", "search_vector"]) == model_to_dict(
        expected, exclude=["embedding", "search_vector"])
