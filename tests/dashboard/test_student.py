"""A student's page (docs/dashboard.md "Pages"): who reaches it, the list/tabs/filters, search through the API's search
service, a memory's detail and history, audited forget/recover/protect, forgetting candidates,
exports, and query counts that do not grow with the stack."""

from __future__ import annotations

import json
from datetime import date, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from accounts.models import AuditEvent, Membership
from dashboard.student import MemoryFilters, memory_detail, retention
from memories.lifecycle.decay_pass import decay_pass
from memories.models import Memory
from memories.search.embedding_jobs import memories_embed
from memories.services import (
    CheckpointInput,
    boot_config_set,
    checkpoint_save,
    memory_batch_create,
    memory_create,
    memory_set_protected,
)
from stacks.models import Stack
from tests.actors import School
from tests.dashboard.pages import client_for
from tests.factories import make_stack, make_user

pytestmark = pytest.mark.django_db

PAYLOADS: dict[str, dict[str, Any]] = {
    "note": {"content": "A note about {n}"},
    "belief": {"statement": "A belief about {n}"},
    "episode": {"objective": "Practise {n}", "outcome": "done"},
    "goal": {"title": "Goal {n}"},
    "value": {"name": "value {n}", "statement": "Care about {n}"},
}


def add_memories(stack: Stack, count: int) -> list[Memory]:
    kinds = list(PAYLOADS)
    items = []
    for n in range(count):
        kind = kinds[n % len(kinds)]
        items.append({"kind": kind, **{k: v.format(n=f"topic {n}") for k, v in PAYLOADS[kind].items()},
                      "tags": ["math"] if n % 2 else ["reading"]})
    return memory_batch_create(stack=stack, items=items, source="api")


def note(stack: Stack, content: str, **fields: Any) -> Memory:
    return memory_create(stack=stack, kind="note", payload={"content": content, **fields}, source="api")


def streamed(response: Any) -> bytes:
    return b"".join(response.streaming_content)


def page_url(stack: Stack, **query: str) -> str:
    url = reverse("dashboard:student", args=[stack.slug])
    if query:
        url += "?" + "&".join(f"{k}={v}" for k, v in query.items())
    return url


def memory_url(memory: Memory) -> str:
    return reverse("dashboard:memory", args=[memory.stack.slug, memory.pk])


def action_url(memory: Memory, action: str) -> str:
    return reverse("dashboard:memory-action", args=[memory.stack.slug, memory.pk, action])


# --- who reaches it --------------------------------------------------------------------------------

def test_admin_sees_the_page_with_header_tabs_and_memories(school: School) -> None:
    add_memories(school.stack, 6)
    response = client_for(school.admin).get(page_url(school.stack))
    assert response.status_code == 200
    body = response.content.decode()
    assert school.stack.slug in body
    assert "Note <span class=\"muted\">(2)</span>" in body
    assert "Belief <span class=\"muted\">(1)</span>" in body
    assert 'class="clamp memory-text"' in body
    assert "Practise topic 2" in body
    assert reverse("dashboard:student-export-json", args=[school.stack.slug]) in body
    assert "Manage" in body  # admins get the manage link


def test_teacher_reaches_an_assigned_stack_without_the_manage_link(school: School) -> None:
    response = client_for(school.teacher).get(page_url(school.stack))
    assert response.status_code == 200
    assert ">Manage<" not in response.content.decode()


@pytest.mark.parametrize("who", ["teacher_unassigned", "other_school_admin", "billing", "anonymous_slug"])
def test_stacks_the_caller_cannot_see_are_404(school: School, other_school: School, who: str) -> None:
    bobs = note(school.other_stack, "Bob's memory")
    alices = note(school.stack, "Alice's memory")
    if who == "teacher_unassigned":
        client, stack = client_for(school.teacher), school.other_stack
    elif who == "other_school_admin":
        client, stack = client_for(other_school.admin), school.stack
    elif who == "billing":
        client, stack = client_for(make_user(school.org, role=Membership.Role.BILLING)), school.stack
    else:
        client, stack = client_for(school.admin), Stack(slug="nobody-here")
    assert client.get(page_url(stack)).status_code == 404
    target = bobs if stack == school.other_stack else alices
    assert client.get(reverse("dashboard:memory", args=[stack.slug, target.pk])).status_code == 404
    assert client.get(reverse("dashboard:student-export-json", args=[stack.slug])).status_code == 404
    assert client.get(reverse("dashboard:student-export-markdown", args=[stack.slug])).status_code == 404
    response = client.post(reverse("dashboard:memory-action", args=[stack.slug, target.pk, "forget"]),
                           {"reason": "nope"})
    assert response.status_code == 404
    assert Memory.objects.filter(forgotten_at__isnull=False).count() == 0


def test_a_memory_of_another_stack_is_404_under_this_stack(school: School) -> None:
    bobs = note(school.other_stack, "Bob's")
    client = client_for(school.admin)
    assert client.get(reverse("dashboard:memory", args=[school.stack.slug, bobs.pk])).status_code == 404


def test_sign_in_required(school: School) -> None:
    response = Client().get(page_url(school.stack))
    assert response.status_code == 302


# --- filters ---------------------------------------------------------------------------------------

def test_kind_tag_and_date_filters(school: School) -> None:
    add_memories(school.stack, 10)
    old = note(school.stack, "An old note", tags=["history"])
    Memory.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=40))
    client = client_for(school.admin)
    body = client.get(page_url(school.stack, kind="belief")).content.decode()
    assert "A belief about topic 1" in body and "A note about" not in body
    body = client.get(page_url(school.stack, tag="history")).content.decode()
    assert "An old note" in body and "topic" not in body
    recent = (timezone.now() - timedelta(days=5)).date().isoformat()
    body = client.get(page_url(school.stack, created_from=recent)).content.decode()
    assert "An old note" not in body and "A note about topic 0" in body
    body = client.get(page_url(school.stack, created_to=recent)).content.decode()
    assert "An old note" in body and "topic 0" not in body


def test_list_is_paginated_newest_first(school: School) -> None:
    memories = [note(school.stack, f"Numbered note {n:02d}") for n in range(30)]
    now = timezone.now()
    for n, memory in enumerate(memories):
        Memory.objects.filter(pk=memory.pk).update(created_at=now - timedelta(minutes=30 - n))
    client = client_for(school.admin)
    first = client.get(page_url(school.stack)).content.decode()
    assert "Numbered note 29" in first and "Numbered note 04" not in first
    assert first.index("Numbered note 29") < first.index("Numbered note 28")
    second = client.get(page_url(school.stack, page="2")).content.decode()
    assert "Numbered note 04" in second and "Numbered note 29" not in second
    assert client.get(page_url(school.stack, page="9")).status_code == 404


@pytest.mark.parametrize("query", [
    {"kind": "nonsense"}, {"created_from": "yesterday"}, {"created_to": "2026-13-45"}, {"forgotten": "maybe"},
    {"page": "abc"}, {"page": "0"}, {"created_from": "2026-05-02", "created_to": "2026-05-01"}, {"q": "a%00b"},
])
def test_bad_filters_are_400_not_500(school: School, query: dict[str, str]) -> None:
    response = client_for(school.admin).get(page_url(school.stack, **query))
    assert response.status_code == 400
    assert "These filters cannot be used" in response.content.decode()


def test_bad_memory_ids_and_actions_are_404(school: School) -> None:
    memory = note(school.stack, "Some note")
    client = client_for(school.admin)
    assert client.get(reverse("dashboard:memory", args=[school.stack.slug, "not-a-uuid"])).status_code == 404
    assert client.get(reverse("dashboard:memory", args=[school.stack.slug,
                                                        "00000000-0000-0000-0000-000000000000"])).status_code == 404
    assert client.post(action_url(memory, "explode")).status_code == 404
    bad_id = reverse("dashboard:memory-action", args=[school.stack.slug, "nope", "recover"])
    assert client.post(bad_id).status_code == 404


def test_empty_stack_explains_how_to_connect_an_agent(school: School) -> None:
    body = client_for(school.admin).get(page_url(school.stack)).content.decode()
    assert "No memories yet" in body
    assert reverse("dashboard:keys") in body
    assert "kernle auth login" in body
    # A teacher is told to ask an admin instead of getting a link to a page they cannot open.
    body = client_for(school.teacher).get(page_url(school.stack)).content.decode()
    assert "No memories yet" in body and reverse("dashboard:keys") not in body


def test_no_match_under_filters_says_so(school: School) -> None:
    add_memories(school.stack, 3)
    body = client_for(school.admin).get(page_url(school.stack, tag="nothing-like-it")).content.decode()
    assert "No memories match these filters" in body


# --- search ----------------------------------------------------------------------------------------

def test_search_finds_a_memory_by_a_word_with_its_score(school: School) -> None:
    target = note(school.stack, "Ada understood fractions once we cut a pizza into slices")
    note(school.stack, "Ada plays football on Saturdays")
    memories_embed(ids=[m.pk for m in Memory.objects.filter(stack=school.stack)])
    response = client_for(school.teacher).get(page_url(school.stack, q="pizza"))
    assert response.status_code == 200
    body = response.content.decode()
    assert "1 result" in body or "2 results" in body
    assert body.index("cut a pizza") < body.index("football") if "football" in body else True
    assert memory_url(target) in body
    assert "score " in body


def test_search_with_no_hits_suggests_removing_filters(school: School) -> None:
    note(school.stack, "Ada understood fractions")
    body = client_for(school.admin).get(page_url(school.stack, q="xylophone", kind="belief")).content.decode()
    assert "No memories match" in body and "remove the filters" in body


# --- detail and actions ----------------------------------------------------------------------------

def test_detail_shows_fields_salience_and_history(school: School) -> None:
    memory = memory_create(stack=school.stack, kind="episode", source="api", payload={
        "objective": "Practise fractions", "outcome": "Solved 8 of 10", "lessons": ["Draw the pie first"]})
    memory_set_protected(memory=memory, protected=True)
    response = client_for(school.admin).get(memory_url(memory))
    assert response.status_code == 200
    body = response.content.decode()
    assert "Practise fractions" in body and "Draw the pie first" in body
    assert "Salience now" in body and "Protected" in body
    assert "is_protected" in body  # the history row says what the change altered
    assert ">Unprotect<" in body and ">Forget<" not in body


def test_forget_with_reason_is_audited_filterable_and_recoverable(school: School) -> None:
    memory = note(school.stack, "A private detail about the family")
    client = client_for(school.teacher)
    response = client.post(action_url(memory, "forget"), {"reason": "Parent asked"})
    assert response.status_code == 302
    memory.refresh_from_db()
    assert memory.forgotten_at is not None and memory.forgotten_reason == "Parent asked"
    event = AuditEvent.objects.get(action="memory.forgotten")
    assert event.target_id == str(memory.pk) and event.actor == school.teacher
    assert event.metadata["reason"] == "Parent asked"
    assert "family" not in json.dumps(event.metadata)  # never the memory's text
    assert "A private detail" not in client.get(page_url(school.stack)).content.decode()
    assert "A private detail" in client.get(page_url(school.stack, forgotten="only")).content.decode()
    detail = client.get(memory_url(memory)).content.decode()
    assert "Parent asked" in detail and ">Recover<" in detail
    assert client.post(action_url(memory, "recover")).status_code == 302
    memory.refresh_from_db()
    assert memory.forgotten_at is None
    assert AuditEvent.objects.filter(action="memory.recovered", target_id=str(memory.pk)).exists()
    assert "A private detail" in client.get(page_url(school.stack)).content.decode()


def test_forget_without_reason_is_400_and_changes_nothing(school: School) -> None:
    memory = note(school.stack, "Keep me")
    response = client_for(school.admin).post(action_url(memory, "forget"), {"reason": "   "})
    assert response.status_code == 400
    assert "This field is required" in response.content.decode()
    memory.refresh_from_db()
    assert memory.forgotten_at is None
    assert not AuditEvent.objects.filter(action="memory.forgotten").exists()


def test_protect_and_unprotect_are_audited(school: School) -> None:
    memory = note(school.stack, "Important")
    client = client_for(school.admin)
    assert client.post(action_url(memory, "protect")).status_code == 302
    memory.refresh_from_db()
    assert memory.is_protected
    # A protected memory cannot be forgotten: a clear 409, nothing changed.
    assert client.post(action_url(memory, "forget"), {"reason": "try"}).status_code == 409
    assert client.post(action_url(memory, "unprotect")).status_code == 302
    memory.refresh_from_db()
    assert not memory.is_protected
    actions = set(AuditEvent.objects.filter(target_id=str(memory.pk)).values_list("action", flat=True))
    assert actions == {"memory.protected", "memory.unprotected"}


def test_writes_to_an_archived_stack_are_409(school: School) -> None:
    archived = make_stack(school.org, "archived-one")
    memory = note(archived, "Frozen")
    Stack.objects.filter(pk=archived.pk).update(status=Stack.Status.ARCHIVED)
    client = client_for(school.admin)
    assert client.get(page_url(archived)).status_code == 200
    assert client.post(action_url(memory, "forget"), {"reason": "x"}).status_code == 409
    memory.refresh_from_db()
    assert memory.forgotten_at is None


def test_get_on_an_action_is_refused(school: School) -> None:
    memory = note(school.stack, "x")
    assert client_for(school.admin).get(action_url(memory, "protect")).status_code == 405


# --- forgetting candidates -------------------------------------------------------------------------

def test_candidates_are_what_the_next_decay_pass_forgets(school: School) -> None:
    fading = note(school.stack, "A stale scratch note")
    kept_value = memory_create(stack=school.stack, kind="value", source="api",
                               payload={"name": "kindness", "statement": "Be kind"})
    fresh = note(school.stack, "A fresh note")
    Memory.objects.filter(pk__in=[fading.pk, kept_value.pk]).update(created_at=timezone.now() - timedelta(days=900))
    client = client_for(school.admin)
    body = client.get(page_url(school.stack)).content.decode()
    section = body[body.index('id="candidates"'):]
    assert "A stale scratch note" in section and "Be kind" not in section and "A fresh note" not in section
    assert 'id="chart-forecast"' in body and 'id="chart-salience"' in body
    # Protecting it from the list takes it off the list.
    response = client.post(action_url(fading, "protect"), {"next": "candidates"})
    assert response.status_code == 302 and response["Location"].endswith("#candidates")
    body = client.get(page_url(school.stack)).content.decode()
    assert "A stale scratch note" not in body[body.index('id="candidates"'):]
    # …and the pass agrees: unprotected again, the pass at the next run forgets exactly it.
    memory_set_protected(memory=fading, protected=False)
    decay_pass(now=timezone.now() + timedelta(hours=1), workers=1)
    forgotten = set(Memory.objects.filter(stack=school.stack, forgotten_at__isnull=False).values_list("pk", flat=True))
    assert forgotten == {fading.pk}
    assert fresh.pk not in forgotten


# --- checkpoint and boot config --------------------------------------------------------------------

def test_checkpoint_and_boot_config_card(school: School) -> None:
    checkpoint_save(stack=school.stack, checkpoint=CheckpointInput(task="Fractions unit", progress="Lesson 3"))
    boot_config_set(stack=school.stack, key="tone", value="encouraging")
    body = client_for(school.admin).get(page_url(school.stack)).content.decode()
    assert "Fractions unit" in body and "Lesson 3" in body
    assert "tone" in body and "encouraging" in body


# --- exports ---------------------------------------------------------------------------------------

def test_json_export_streams_live_memories_and_is_audited(school: School) -> None:
    add_memories(school.stack, 7)
    gone = note(school.stack, "Forgotten one")
    Memory.objects.filter(pk=gone.pk).update(forgotten_at=timezone.now())
    response = client_for(school.teacher).get(reverse("dashboard:student-export-json", args=[school.stack.slug]))
    assert response.status_code == 200
    assert response.streaming
    assert response["Content-Disposition"].startswith("attachment;")
    document = json.loads(streamed(response))
    assert document["stack"]["slug"] == school.stack.slug
    assert len(document["memories"]) == 7
    assert "embedding" not in document["memories"][0]
    event = AuditEvent.objects.get(action="stack.exported")
    assert event.target_id == school.stack.slug and event.metadata == {"format": "json"}


def test_json_export_of_an_empty_stack_is_valid_json(school: School) -> None:
    response = client_for(school.admin).get(reverse("dashboard:student-export-json", args=[school.stack.slug]))
    assert json.loads(streamed(response))["memories"] == []


def test_memory_md_download_is_audited(school: School) -> None:
    memory_create(stack=school.stack, kind="belief", source="api",
                  payload={"statement": "Pictures help with fractions", "confidence": 0.9})
    response = client_for(school.admin).get(reverse("dashboard:student-export-markdown", args=[school.stack.slug]))
    assert response.status_code == 200
    assert response["Content-Disposition"].startswith("attachment;")
    assert "Pictures help with fractions" in response.content.decode()
    assert AuditEvent.objects.filter(action="stack.exported", metadata__format="memory.md").exists()


# --- query counts ----------------------------------------------------------------------------------

def _queries(client: Client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200
    return len(captured.captured_queries)


def test_student_page_queries_do_not_grow_with_memories(school: School) -> None:
    client = client_for(school.admin)
    add_memories(school.stack, 3)
    add_memories(school.other_stack, 80)
    # Some of the larger stack fading, so candidates and charts have rows to show.
    Memory.objects.filter(stack=school.other_stack, kind="note").update(created_at=timezone.now() - timedelta(days=900))
    Memory.objects.filter(stack=school.stack, kind="note").update(created_at=timezone.now() - timedelta(days=900))
    for stack in (school.stack, school.other_stack):
        checkpoint_save(stack=stack, checkpoint=CheckpointInput(task="Unit"))
    client.get(page_url(school.stack))  # warm per-process caches (content types, sessions)
    small = _queries(client, page_url(school.stack))
    large = _queries(client, page_url(school.other_stack))
    assert small == large
    assert _queries(client, page_url(school.stack, forgotten="include", tag="math")) == \
        _queries(client, page_url(school.other_stack, forgotten="include", tag="math"))


def test_memory_detail_queries_do_not_grow_with_revisions(school: School) -> None:
    client = client_for(school.admin)
    few = note(school.stack, "Few changes")
    many = note(school.stack, "Many changes")
    for n in range(12):
        memory_set_protected(memory=many, protected=n % 2 == 0)
    client.get(memory_url(few))
    assert _queries(client, memory_url(few)) == _queries(client, memory_url(many))


# --- the read model --------------------------------------------------------------------------------

def test_filters_know_when_they_narrow_and_cover_whole_days() -> None:
    assert not MemoryFilters().narrowed
    assert MemoryFilters(tag="math").narrowed and MemoryFilters(forgotten="only").narrowed
    day = date(2026, 5, 1)
    filters = MemoryFilters(created_from=day, created_to=day)
    assert filters.created_after is not None and filters.created_before is not None
    assert filters.created_before - filters.created_after == timedelta(days=1)


def test_retention_forecast_counts_grow_and_start_with_the_candidates(school: School) -> None:
    notes = [note(school.stack, f"Scratch {n}") for n in range(3)]
    now = timezone.now()
    Memory.objects.filter(pk=notes[0].pk).update(created_at=now - timedelta(days=900))
    Memory.objects.filter(pk=notes[1].pk).update(created_at=now - timedelta(days=120))
    result = retention(school.stack, now=now)
    assert now < result.next_pass_at <= now + timedelta(hours=1)
    assert result.forecast_rows[0][0] == "Next pass"
    counts = [count for _, count in result.forecast_rows]
    assert counts == sorted(counts)  # salience only falls: each horizon includes the earlier ones
    assert result.forgotten_next_pass == len(result.candidates) == 1
    assert counts[-1] == 2  # the 120-day-old note fades within 90 days, the new one does not
    assert result.live == 3


def test_memory_detail_lists_what_each_revision_changed(school: School) -> None:
    memory = memory_create(stack=school.stack, kind="episode", source="api", payload={
        "objective": "Practise fractions", "outcome": "ok", "lessons": ["Draw the pie first"]})
    memory_set_protected(memory=memory, protected=True)
    memory_set_protected(memory=memory, protected=False)
    memory.refresh_from_db()
    detail = memory_detail(memory)
    assert detail.revision_count == 2
    assert [row.revision.action for row in detail.revisions] == ["unprotect", "protect"]
    assert all(row.changed == ["is_protected"] for row in detail.revisions)
    shapes = {name: shape for name, shape, _ in detail.data_items}
    assert shapes["objective"] == "text" and shapes["lessons"] == "list"
