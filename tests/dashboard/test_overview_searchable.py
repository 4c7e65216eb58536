"""The overview's attention item when search by meaning is behind (docs/algorithms.md §10.2.3):
the recent time to searchable of the caller's stacks, over TIME_TO_SEARCHABLE_ATTENTION_SECONDS,
never another school's and never a stack the caller does not reach."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from memories.models import Memory
from memories.services import memory_create
from memoryhub import time_to_searchable
from memoryhub.time_to_searchable import Sample
from tests.actors import School

pytestmark = pytest.mark.django_db

ITEM = 'data-attention="searchable"'


def page(user: Any) -> str:
    return overview(user).content.decode()


def overview(user: Any) -> Any:
    client = Client()
    client.force_login(user)
    response = client.get("/dashboard/")
    assert response.status_code == 200
    return response


def stored(organization_id: int, stack_id: int, *seconds: float, minutes_ago: float = 0) -> None:
    time_to_searchable.record([Sample(organization_id, stack_id, wait) for wait in seconds],
                              stored_at=time.time() - 60 * minutes_ago)


@pytest.fixture(autouse=True)
def _no_recent_samples(school: School, other_school: School) -> None:
    """This session's Redis outlives each test's rows."""
    time_to_searchable._redis().delete(*(time_to_searchable._school_key(s.org.pk) for s in (school, other_school)))


def test_a_slow_time_to_searchable_is_shown_to_whoever_reaches_the_stack_and_no_one_else(
        school: School, other_school: School) -> None:
    stored(school.org.pk, school.other_stack.pk, *[300.0] * 20)  # "bob": the teacher's colleague's student

    response = overview(school.admin)
    delay = response.context["attention"].slow_searchable
    assert (delay.seconds, delay.still_waiting, delay.window_minutes) == (300.0, False, 15)
    admin = response.content.decode()
    assert ITEM in admin
    assert "New memories take about 5 minutes to become searchable by meaning" in admin
    assert "95% of those that became searchable in the last 15 minutes" in admin
    assert "Keyword search finds them at once" in admin
    assert ITEM not in page(school.teacher)  # assigned to "alice" only
    assert ITEM not in page(other_school.admin)
    # Even a sample filed under the other school that named this school's stack stays out of its
    # page: samples are kept only for the stacks the caller reaches (stacks_visible_to).
    stored(other_school.org.pk, school.other_stack.pk, *[600.0] * 20)
    assert ITEM not in page(other_school.admin)

    stored(school.org.pk, school.stack.pk, *[200.0] * 20)
    teacher = page(school.teacher)
    assert ITEM in teacher and "about 3 minutes" in teacher  # the teacher's students' own figure


def test_the_threshold_is_a_setting_and_the_figure_a_recent_p95(school: School, settings: Any) -> None:
    stored(school.org.pk, school.stack.pk, *[5.0] * 19, 1000.0)  # one slow vector in twenty: not the p95
    stored(school.org.pk, school.stack.pk, *[3000.0] * 50, minutes_ago=16)  # before the window
    assert ITEM not in page(school.admin)

    settings.TIME_TO_SEARCHABLE_ATTENTION_SECONDS = 5
    assert "New memories take about 5 seconds" in page(school.admin)

    settings.TIME_TO_SEARCHABLE_ATTENTION_SECONDS = 120
    stored(school.org.pk, school.stack.pk, 1000.0)  # two in twenty-one: the p95 now
    assert "about 17 minutes" in page(school.admin)


def test_a_memory_still_waiting_shows_when_the_worker_stores_nothing(school: School, other_school: School) -> None:
    memory = memory_create(stack=school.stack, kind="note", payload={"content": "no vector yet"}, source="api")
    Memory.objects.filter(pk=memory.pk).update(server_updated_at=timezone.now() - timedelta(minutes=10))

    response = overview(school.admin)
    assert response.context["attention"].slow_searchable.still_waiting
    admin = response.content.decode()
    assert ITEM in admin and "A memory written 10 minutes ago is still not searchable by meaning" in admin
    assert "Keyword search finds them at once" in admin
    assert ITEM in page(school.teacher)  # "alice" is the teacher's
    assert ITEM not in page(other_school.admin)

    # Waiting since long before the lookback: a model switch's re-embedding, not a new memory.
    Memory.objects.filter(pk=memory.pk).update(server_updated_at=timezone.now() - timedelta(days=2))
    assert ITEM not in page(school.admin)
